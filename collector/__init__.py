"""kvscope's collector: events into DuckDB, replays through vLLM's block manager, summaries."""
