"""Pure models over records: miss-ratio curves, block streams, KV memory, time windows and
run comparison. Nothing here imports DuckDB."""
