"""Run files: the DuckDB schema, the run-file objects that own a connection, ingest and rollups."""
