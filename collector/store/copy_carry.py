"""What a live copy carries over from the copy before it, so that the largest of the tables
derived whole (rollups.py), those derived from the cache lifetimes (lifetime_rollups.py),
cost what is new since the last copy rather than what the run holds.

A lifetime that has ended (its block evicted, or the cache reset) is final: the hits after
it go to its block's later stores. So the next copy keeps the closed lifetimes of the copy
before it as they were, and matches only the open ones and the stores from the first new
event row on to the evictions, resets and hits from that row on
(`CARRIED_LIFETIME_ENDS` and after). A run file's event rows are never deleted, so the rows of a
copy are those of the copy before it and then the new ones. The new hits' counts add to
the previous ones per block hash (`prefix_blocks`, whose hashes the new rows or an open
lifetime touch are figured again from their lifetimes) and per time bucket and pair of
tenants (`tenant_sharing`).

The fleet's states then change from the earliest of the new rows' times and the end of the
copy before (where its open lifetimes ended) on: the states before it stand, and those
from it on are derived from the lifetimes cached then or after
(`CARRIED_FLEET_STATES`), a few per cached block.

The lookups' causes (lookup_causes.py) of the requests that finished before the new rows
are final and stand; the others' are derived again (`CARRIED_LOOKUP_CAUSES`).

This equals building the tables from every event row, as long as each engine's new rows
come after its rows of the copy before (record numbers above its last), which an engine's
one connection to its collector keeps, the run's settings and its engines' stops are
unchanged, and so is the time grid (whose buckets are 1, 2 or 5 x 10^k ns: they coarsen as
the run grows, a few times over its life). A copy where one fails (an engine restarted under
the same engine id numbers its records from 0 again; the first engine to connect sets the
run's settings; an engine stopped, which ends its lifetimes for the lookups' causes of the
others) builds them whole. Each copy says which it did (`meta`, key "live_copy_tables").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import duckdb

from collector.store.fleet_states import CARRIED_FLEET_STATES, WHOLE_FLEET_STATES
from collector.store.lifetime_rollups import (
    CARRIED_CACHE_LIFETIMES,
    CARRIED_HIT_STORES,
    CARRIED_LIFETIME_ENDS,
    CARRIED_PREFIX_BLOCKS,
    CARRIED_TENANT_SHARING,
    PREVIOUS_COPY,
    WHOLE_CACHE_LIFETIMES,
    WHOLE_PREFIX_BLOCKS,
    WHOLE_TENANT_SHARING,
)
from collector.store.lookup_causes import (
    CARRIED_LOOKUP_CAUSES,
    ENGINE_STOP_KEY,
    WHOLE_LOOKUP_CAUSES,
)
from collector.store.sql_literal import path_literal

# The run's settings, and its engines' stops (which end lifetimes in the lookups' causes).
_SETTINGS = f"""SELECT CAST(options AS VARCHAR), block_size, num_blocks,
    (SELECT string_agg(value, ',' ORDER BY key) FROM meta
     WHERE starts_with(key, '{ENGINE_STOP_KEY} '))
    FROM runs"""
_GRID = "SELECT start_ns, bucket_ns, block_bin_size FROM {database}.rollup_grid"
_SEQ_RANGES = """
    SELECT coalesce(engine_id, '') AS engine, coalesce(dp_rank, 0) AS rank,
        min(seq) AS first_seq, max(seq) AS last_seq
    FROM events
    WHERE rowid >= $first
    GROUP BY ALL
"""
# Where the fleet's states may change from: the end of the copy before (where its open
# lifetimes ended; none if it had no states) and the earliest new store, eviction or reset.
_STATES_CHANGE_FROM = """
    SELECT (SELECT max(until_ns) FROM previous_copy.fleet_states),
        (SELECT min(ts_ns) FROM events
         WHERE rowid >= $first AND kind IN ('store', 'evict', 'reset'))
"""

# What the copy says of its tables (`meta`, key "live_copy_tables"): "carried" or "whole".
_NOTE = "INSERT OR REPLACE INTO meta VALUES ('live_copy_tables', ?)"

EngineSeqs = dict[tuple[str, int], int]


@dataclass(frozen=True)
class CopyMarks:
    """Where a copy's events end: its event rows, each engine's last record number, and the
    run's settings its tables were derived under."""

    num_rows: int
    last_seqs: EngineSeqs
    settings: tuple[object, ...]


@dataclass(frozen=True)
class PreviousCopy:
    """The copy before, published at `path`, and its marks."""

    path: Path
    marks: CopyMarks


class CopyCarry:
    """Builds the tables derived from the cache lifetimes in a copy, carried over from the
    copy before when that holds (above), else from every event row."""

    def __init__(self) -> None:
        self.marks: CopyMarks | None = None  # of the copy last built here
        self.carried = False  # whether that copy's tables were carried over
        self._first_new = 0  # the copy's first event row new since the copy before

    def steps(
        self, connection: duckdb.DuckDBPyConnection, previous: PreviousCopy | None
    ) -> dict[str, Callable[[], None]]:
        """The steps that build the carried tables, by table; the rebuild runs them in its
        order, the lifetimes first and the lookups' causes last."""
        return {
            "cache_lifetimes": partial(self._lifetimes, connection, previous),
            "prefix_blocks": partial(self._prefix_blocks, connection),
            "tenant_sharing": partial(self._tenant_sharing, connection),
            "fleet_states": partial(self._fleet_states, connection),
            "lookup_causes": partial(self._lookup_causes, connection),
        }

    def _lifetimes(
        self, connection: duckdb.DuckDBPyConnection, previous: PreviousCopy | None
    ) -> None:
        settings = _settings(connection)
        new = _new_rows(connection, previous)
        self.carried = False
        if previous is not None and new is not None and settings == previous.marks.settings:
            attach = f"ATTACH {path_literal(previous.path)} AS {PREVIOUS_COPY} (READ_ONLY)"
            connection.execute(attach)
            self.carried = _same_grid(connection)
            if not self.carried:
                connection.execute(f"DETACH {PREVIOUS_COPY}")
        if not self.carried or previous is None or new is None:
            connection.execute(WHOLE_CACHE_LIFETIMES)
            self.marks = CopyMarks(_num_rows(connection), _last_seqs(connection, 0), settings)
            return
        self._first_new = previous.marks.num_rows
        first_row = {"first_row": self._first_new}
        connection.execute(CARRIED_LIFETIME_ENDS, first_row)
        connection.execute(CARRIED_HIT_STORES, first_row)
        connection.execute(CARRIED_CACHE_LIFETIMES)
        num_rows, new_seqs = new
        self.marks = CopyMarks(num_rows, previous.marks.last_seqs | new_seqs, settings)

    def _prefix_blocks(self, connection: duckdb.DuckDBPyConnection) -> None:
        if self.carried:
            connection.execute(CARRIED_PREFIX_BLOCKS, {"first_row": self._first_new})
        else:
            connection.execute(WHOLE_PREFIX_BLOCKS)

    def _tenant_sharing(self, connection: duckdb.DuckDBPyConnection) -> None:
        connection.execute(CARRIED_TENANT_SHARING if self.carried else WHOLE_TENANT_SHARING)

    def _fleet_states(self, connection: duckdb.DuckDBPyConnection) -> None:
        if self.carried:
            row = connection.execute(_STATES_CHANGE_FROM, {"first": self._first_new}).fetchone()
            if row is None or row[0] is None:  # one engine before: no states to carry
                connection.execute(WHOLE_FLEET_STATES)
            else:
                since_ns = min(int(value) for value in row if value is not None)
                connection.execute(CARRIED_FLEET_STATES, {"since_ns": since_ns})
        else:
            connection.execute(WHOLE_FLEET_STATES)

    def _lookup_causes(self, connection: duckdb.DuckDBPyConnection) -> None:
        if self.carried:
            connection.execute(CARRIED_LOOKUP_CAUSES, {"first_row": self._first_new})
            connection.execute(f"DETACH {PREVIOUS_COPY}")
        else:
            connection.execute(WHOLE_LOOKUP_CAUSES)
        connection.execute(_NOTE, ["carried" if self.carried else "whole"])


def _same_grid(connection: duckdb.DuckDBPyConnection) -> bool:
    """Whether this copy's time grid is that of the copy before (attached)."""
    grids = [
        connection.execute(_GRID.format(database=database)).fetchall()
        for database in ("main", PREVIOUS_COPY)
    ]
    return grids[0] == grids[1]


def _new_rows(
    connection: duckdb.DuckDBPyConnection, previous: PreviousCopy | None
) -> tuple[int, EngineSeqs] | None:
    """The copy's event rows and each engine's last record number among the rows new since
    `previous`; None when the new rows do not follow on from it (above)."""
    if previous is None or not previous.path.exists():
        return None
    num_rows = _num_rows(connection)
    first = previous.marks.num_rows
    if num_rows < first:
        return None
    ranges = _seq_ranges(connection, first)
    before = previous.marks.last_seqs
    if any(engine in before and first_seq <= before[engine]
           for engine, (first_seq, _) in ranges.items()):  # fmt: skip
        return None
    return num_rows, {engine: last_seq for engine, (_, last_seq) in ranges.items()}


def _last_seqs(connection: duckdb.DuckDBPyConnection, first: int) -> EngineSeqs:
    return {engine: last_seq for engine, (_, last_seq) in _seq_ranges(connection, first).items()}


def _seq_ranges(
    connection: duckdb.DuckDBPyConnection, first: int
) -> dict[tuple[str, int], tuple[int, int]]:
    """Each engine's (and DP rank's) first and last record number from event row `first`."""
    rows = connection.execute(_SEQ_RANGES, {"first": first}).fetchall()
    return {(engine, rank): (first_seq, last_seq) for engine, rank, first_seq, last_seq in rows}


def _num_rows(connection: duckdb.DuckDBPyConnection) -> int:
    row = connection.execute("SELECT count(*) FROM events").fetchone()
    return int(row[0]) if row else 0


def _settings(connection: duckdb.DuckDBPyConnection) -> tuple[object, ...]:
    row = connection.execute(_SETTINGS).fetchone()
    return tuple(row) if row else ()
