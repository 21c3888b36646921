"""DuckDB's own Arrow insert, timed on a run's rows: the yardstick of the collector's ingest."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa

from collector.store.ingest import INGESTED_TABLES
from collector.store.run_file import RunConfig, RunFile, RunStore


def duckdb_insert_rate(
    run_path: Path, scratch: Path, num_transactions: int = 1, threads: int | None = None
) -> float:
    """Rows per second DuckDB takes a run's ingested rows in, as Arrow tables already in
    memory, into a new run file at `scratch`, in `num_transactions` transactions of equal
    shares of every table, with at most `threads` threads (None: DuckDB's default, a thread
    per core)."""
    with RunFile.open(run_path) as run:
        tables = {name: run.arrow(f"SELECT * FROM {name}") for name in INGESTED_TABLES}
    num_rows = sum(int(table.num_rows) for table in tables.values())
    store = RunStore.create(scratch, RunConfig("engine", 16, 0, "unknown", "yardstick"))
    if threads is not None:
        store.limit_threads(threads)
    try:
        started = time.perf_counter()
        for part in range(num_transactions):
            shares = {name: _share(table, part, num_transactions) for name, table in tables.items()}
            store.insert(shares)
        elapsed = time.perf_counter() - started
    finally:
        store.close()
    return num_rows / elapsed


def _share(table: pa.Table, part: int, num_parts: int) -> pa.Table:
    start = table.num_rows * part // num_parts
    return table.slice(start, table.num_rows * (part + 1) // num_parts - start)
