"""One entry of a run file's `meta` table written after the run was made: what kvscope keeps
beside a run's records (the advisor's advice, the names given its prefix families)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import duckdb

from collector.store.parquet_dataset import is_dataset
from collector.store.run_file import StoreError
from collector.store.run_opening import open_checked


def write_meta_entry(path: Path, key: str, value: Callable[[str | None], str]) -> str | None:
    """Set the run file's `meta` entry `key` to `value(its value now, or None)`, in one
    statement; no connection to the file may be open in this process. None when written,
    else why not, in words (a dataset, a read-only file, one another process holds)."""
    if is_dataset(path):
        return "a Parquet dataset is not written to"
    if not os.access(path, os.W_OK):
        return "the run file is read only"
    try:
        connection = open_checked(path, read_only=False)
    except StoreError as error:
        return str(error).removeprefix(f"{path}: ")
    try:
        row = connection.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
        written = value(str(row[0]) if row else None)
        connection.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [key, written])
    except duckdb.Error as error:
        return str(error).splitlines()[0]
    finally:
        connection.close()
    return None
