"""The tables of a run file derived from its events, and when a refresh brings them up to
date: the eviction ages every time, from the rows new since the last refresh
(eviction_ages.py); the tables derived whole (`requests` and the rollups, schema.py) when
asked to or when due.

Rebuilding those costs more as the run grows (seconds at ten million rows), so a live
refresh rebuilds them every time only while that takes under REBUILD_ALWAYS_S, and beyond
that once REBUILD_SPACING times the last rebuild's duration has passed since it ended: the
rebuilds then take at most a fifth of the collector's time, and those tables lag the events
by up to about five times a rebuild's duration. `RunStore.finalize` rebuilds them all.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from functools import partial

import duckdb

from collector.store.eviction_ages import EvictionAges
from collector.store.schema import DERIVED_STATEMENTS

REBUILD_ALWAYS_S = 1.0
REBUILD_SPACING = 4

Step = tuple[str, Callable[[], object]]


class DerivedTables:
    """The derived tables of the run file a writing connection holds."""

    def __init__(self, connection: duckdb.DuckDBPyConnection) -> None:
        self._connection = connection
        self._eviction_ages = EvictionAges()
        self._rebuilt: tuple[float, float] | None = None  # when it ended, seconds it took
        self.stale = False  # a refresh left the tables derived whole behind the events

    def refresh(self, rebuild: bool) -> None:
        """Fold the new rows into the eviction ages; rebuild the tables derived whole if
        `rebuild` or if due."""
        rebuild = rebuild or self._rebuild_due()
        started = time.monotonic()
        for _, step in self.steps(rebuild):
            step()
        if rebuild:
            ended = time.monotonic()
            self._rebuilt = (ended, ended - started)
        self.stale = not rebuild

    def steps(self, rebuild: bool) -> list[Step]:
        """What `refresh` does, in order, each named by what it derives."""
        steps: list[Step] = [("eviction ages", partial(self._eviction_ages.fold, self._connection))]
        if rebuild:
            steps += [
                (_table_made_by(statement), partial(self._connection.execute, statement))
                for statement in DERIVED_STATEMENTS
            ]
        return steps

    def _rebuild_due(self) -> bool:
        if self._rebuilt is None:
            return True
        ended, seconds = self._rebuilt
        return seconds < REBUILD_ALWAYS_S or time.monotonic() - ended >= REBUILD_SPACING * seconds


def _table_made_by(statement: str) -> str:
    table = re.search(r"CREATE OR REPLACE TABLE (\w+)", statement)
    assert table is not None
    return table[1]
