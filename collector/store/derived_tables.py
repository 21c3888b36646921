"""The tables of a run file derived from its events: the eviction ages, folded in from the
rows new since the last fold (eviction_ages.py), and the tables derived whole (`requests`
and the rollups, schema.py), rebuilt from every event.

A collector folds on its writing thread, which costs what is new; the rebuild costs what
the run holds (minutes at 100 million rows), so while engines run it happens in the live
copy, off that thread (live_copy.py), and in the run file itself when it is finalized.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial

import duckdb
import pandas as pd

from collector.store.copy_carry import CopyCarry, PreviousCopy
from collector.store.eviction_ages import EvictionAges
from collector.store.schema import DERIVED_STATEMENTS

Step = tuple[str, Callable[[], object]]


class DerivedTables:
    """The derived tables of the run file a writing connection holds."""

    def __init__(self, connection: duckdb.DuckDBPyConnection) -> None:
        self._connection = connection
        self._eviction_ages = EvictionAges()

    def refresh(self, rebuild: bool) -> None:
        """Fold the new rows into the eviction ages; rebuild the tables derived whole if
        `rebuild`."""
        for _, step in self.steps(rebuild):
            step()

    def seed_eviction_ages(self, state: pd.DataFrame) -> None:
        """Fold the eviction ages onto `state` (a segmented run's closed segments')."""
        self._eviction_ages.seed(self._connection, state)

    def rows_removed(self) -> None:
        """The record tables' rows were deleted: the eviction ages fold on from none."""
        self._eviction_ages.rows_removed()

    def steps(self, rebuild: bool) -> list[Step]:
        """What `refresh` does, in order, each named by what it derives."""
        steps: list[Step] = [("eviction ages", partial(self._eviction_ages.fold, self._connection))]
        if rebuild:
            steps += rebuild_steps(self._connection)
        return steps


def rebuild_steps(
    connection: duckdb.DuckDBPyConnection,
    carry: CopyCarry | None = None,
    previous: PreviousCopy | None = None,
) -> list[Step]:
    """The statements that rebuild the tables derived whole, each named by its table; with
    `carry`, the cache lifetimes and the tables derived from them are carried over from the
    `previous` copy where they can be (copy_carry.py)."""
    carried = carry.steps(connection, previous) if carry is not None else {}
    steps: list[Step] = []
    for statement in DERIVED_STATEMENTS:
        table = _table_made_by(statement)
        steps.append((table, carried.get(table, partial(connection.execute, statement))))
    return steps


def _table_made_by(statement: str) -> str:
    table = re.search(r"CREATE OR REPLACE TABLE (\w+)", statement)
    assert table is not None
    return table[1]
