"""DuckDB's own Arrow insert, timed on a run's rows: the yardstick of the collector's ingest."""

from __future__ import annotations

import time
from pathlib import Path

from collector.store.run_file import RunConfig, RunFile, RunStore

# The tables a capture fills (the derived ones are built by `finalize`, not ingested).
INGESTED_TABLES = ("events", "pool", "collisions")


def duckdb_insert_rate(run_path: Path, scratch: Path) -> float:
    """Rows per second DuckDB takes a run's ingested rows in, as Arrow tables already in
    memory, into a new run file at `scratch`, in one transaction."""
    with RunFile.open(run_path) as run:
        tables = {name: run.arrow(f"SELECT * FROM {name}") for name in INGESTED_TABLES}
    num_rows = sum(int(table.num_rows) for table in tables.values())
    store = RunStore.create(scratch, RunConfig("engine", 16, 0, "unknown", "yardstick"))
    try:
        started = time.perf_counter()
        store.insert(tables)
        elapsed = time.perf_counter() - started
    finally:
        store.close()
    return num_rows / elapsed
