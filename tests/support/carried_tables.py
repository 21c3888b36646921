"""The tables a live copy carries over from the copy before (collector/store/copy_carry.py),
as a copy holds them and as a whole rebuild of the same copy derives them."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

from collector.store.run_file import RunFile, RunStore

CARRIED = (  # in order
    "cache_lifetimes",
    "prefix_blocks",
    "tenant_sharing",
    "fleet_states",
    "lookup_causes",
)

Tables = dict[str, Counter[tuple[object, ...]]]


def published_tables(copy: Path) -> tuple[str | None, Tables]:
    """What the copy says of its tables ("carried" or "whole"), and their rows."""
    with RunFile.open_live_copy(copy) as run:
        note = run.row("SELECT value FROM meta WHERE key = 'live_copy_tables'")
        tables = {table: Counter(run.rows(f"SELECT * FROM {table}")) for table in CARRIED}
    return (str(note[0]) if note else None), tables


def whole_tables(copy: Path, scratch: Path) -> Tables:
    """The copy's carried tables built again from every event row, in a copy of its own."""
    shutil.copy(copy, scratch)
    with RunStore.open_copy(scratch) as store:
        steps = dict(store.rebuild_steps())
        for table in CARRIED:
            steps[table]()
        tables = {table: Counter(store.rows(f"SELECT * FROM {table}")) for table in CARRIED}
    scratch.unlink()
    return tables
