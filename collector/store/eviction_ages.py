"""Each evicted block's age (since its last store) and the hits it got meanwhile, folded in
as rows arrive, so that a refresh costs what is new, not what the run holds.

The engine counts neither: both come from the same engine's store and hit rows of that
block id. `EvictionAges` keeps, in a temporary table of the writing connection, one row per
(engine, DP rank, block id): the record number and time of its last store, the hits since
that store, and the last record number of the block folded in; and it remembers how many
event rows it has folded. A refresh reads only the event rows past that mark and fills only
the new evictions. A block whose store was lost with dropped records keeps NULL (unknown).

This equals deriving every age from all the rows at each refresh, as long as each block's
rows arrive in record-number order, which an engine's one connection to its collector
keeps. A row that breaks the order (an engine restarted under the same engine id numbers
its records from 0 again) makes that refresh start over from the first row. So does a new
connection: the state lives and dies with it, so a collector resumed after a crash folds
the whole file once.
"""

from __future__ import annotations

import duckdb
import pandas as pd

# The rows a fold reads: the store, hit and evict rows from event row $first on.
_FRESH = """
    fresh AS (
        SELECT rowid AS row_id, seq, kind, ts_ns, block_id, age_ns,
            coalesce(engine_id, '') AS engine, coalesce(dp_rank, 0) AS rank
        FROM events
        WHERE rowid >= $first AND kind IN ('evict', 'store', 'hit')
    )
"""

_CREATE_STATE = """
    CREATE OR REPLACE TEMP TABLE eviction_state (
        engine VARCHAR NOT NULL,
        rank SMALLINT NOT NULL,
        block_id INTEGER NOT NULL,
        store_seq UBIGINT,
        store_ns BIGINT,
        hits BIGINT NOT NULL,
        last_seq UBIGINT NOT NULL
    )
"""

_OUT_OF_ORDER = f"""
    WITH {_FRESH}
    SELECT count(*) FROM fresh JOIN temp.eviction_state AS state
        ON fresh.engine = state.engine AND fresh.rank = state.rank
        AND fresh.block_id = state.block_id
    WHERE fresh.seq <= state.last_seq
"""

# The latest store before an eviction is a new one or the block's last store folded before
# (whose record number is below every new row's); the hits since it are the new hits before
# the eviction and after that store, plus the folded ones when the store is the folded one.
_FILL_AGES = f"""
    UPDATE events SET age_ns = aged.age_ns, num_hits = aged.num_hits
    FROM (
        WITH {_FRESH},
        evicted AS (
            SELECT row_id, seq, ts_ns, engine, rank, block_id
            FROM fresh WHERE kind = 'evict' AND age_ns IS NULL
        ),
        stored AS (
            SELECT seq AS store_seq, ts_ns AS store_ns, engine, rank, block_id
            FROM fresh WHERE kind = 'store'
            UNION ALL
            SELECT store_seq, store_ns, engine, rank, block_id
            FROM temp.eviction_state WHERE store_seq IS NOT NULL
        ),
        hits AS (
            SELECT seq AS hit_seq, engine, rank, block_id,
                row_number() OVER (PARTITION BY engine, rank, block_id ORDER BY seq)
                    AS hits_so_far
            FROM fresh WHERE kind = 'hit'
        ),
        since_store AS (
            SELECT evicted.*, stored.store_seq, evicted.ts_ns - stored.store_ns AS age_ns
            FROM evicted ASOF JOIN stored
                ON evicted.engine = stored.engine AND evicted.rank = stored.rank
                AND evicted.block_id = stored.block_id AND stored.store_seq < evicted.seq
        ),
        hits_at_evict AS (
            SELECT since_store.*, coalesce(hits.hits_so_far, 0) AS hits_then
            FROM since_store ASOF LEFT JOIN hits
                ON since_store.engine = hits.engine AND since_store.rank = hits.rank
                AND since_store.block_id = hits.block_id AND hits.hit_seq < since_store.seq
        )
        SELECT hits_at_evict.row_id, hits_at_evict.age_ns,
            hits_at_evict.hits_then - coalesce(hits.hits_so_far, 0)
                + CASE WHEN hits_at_evict.store_seq = state.store_seq THEN state.hits ELSE 0 END
                AS num_hits
        FROM hits_at_evict
        ASOF LEFT JOIN hits
            ON hits_at_evict.engine = hits.engine AND hits_at_evict.rank = hits.rank
            AND hits_at_evict.block_id = hits.block_id
            AND hits.hit_seq < hits_at_evict.store_seq
        LEFT JOIN temp.eviction_state AS state
            ON hits_at_evict.engine = state.engine AND hits_at_evict.rank = state.rank
            AND hits_at_evict.block_id = state.block_id
    ) AS aged
    WHERE events.rowid >= $first AND events.rowid = aged.row_id
"""

# Each block's state after the new rows: a new store starts its hit count again.
_FOLD_STATE = f"""
    CREATE OR REPLACE TEMP TABLE eviction_state AS
    WITH {_FRESH},
    latest AS (
        SELECT engine, rank, block_id, max(seq) AS last_seq,
            max(seq) FILTER (WHERE kind = 'store') AS store_seq,
            arg_max(ts_ns, seq) FILTER (WHERE kind = 'store') AS store_ns
        FROM fresh GROUP BY ALL
    ),
    new_hits AS (
        SELECT latest.engine, latest.rank, latest.block_id, count(*) AS hits
        FROM fresh JOIN latest
            ON fresh.engine = latest.engine AND fresh.rank = latest.rank
            AND fresh.block_id = latest.block_id
        WHERE fresh.kind = 'hit' AND (latest.store_seq IS NULL OR fresh.seq > latest.store_seq)
        GROUP BY ALL
    )
    SELECT engine, rank, block_id,
        coalesce(latest.store_seq, state.store_seq) AS store_seq,
        CASE WHEN latest.store_seq IS NULL THEN state.store_ns ELSE latest.store_ns END
            AS store_ns,
        CASE WHEN latest.store_seq IS NULL THEN coalesce(state.hits, 0) ELSE 0 END
            + coalesce(new_hits.hits, 0) AS hits,
        greatest(latest.last_seq, state.last_seq) AS last_seq
    FROM temp.eviction_state AS state
    FULL JOIN latest USING (engine, rank, block_id)
    LEFT JOIN new_hits USING (engine, rank, block_id)
"""
# The state a segmented run's closed segments leave (the view `closed_events`,
# segmented_run.py), folded onto none: where a collector resumed on its head starts from
# (resume_point.py); then its own rows are folded onto it.
CLOSED_STATE_SQL = (
    _CREATE_STATE,
    _FOLD_STATE.replace(
        _FRESH,
        _FRESH.replace("rowid AS row_id", "0 AS row_id").replace(
            "FROM events\n        WHERE rowid >= $first AND", "FROM closed_events\n        WHERE"
        ),
    ),
    "SELECT * FROM temp.eviction_state",
)
assert "FROM closed_events" in CLOSED_STATE_SQL[1]  # the fold's rows replaced


class EvictionAges:
    """The eviction ages of one run file, folded in from the event rows its connection has
    not folded yet."""

    def __init__(self) -> None:
        self.num_folded = 0  # event rows folded in; rows are deleted only by `rows_removed`
        self._state_made = False

    def seed(self, connection: duckdb.DuckDBPyConnection, state: pd.DataFrame) -> None:
        """Start from `state` (CLOSED_STATE_SQL's rows), folding the rows from the first on."""
        connection.execute(_CREATE_STATE)
        connection.register("_seed", state)
        connection.execute("INSERT INTO temp.eviction_state BY NAME SELECT * FROM _seed")
        connection.unregister("_seed")
        self.num_folded, self._state_made = 0, True

    def rows_removed(self) -> None:
        """Every event row was deleted (a segment closed, segments.py) and the file
        checkpointed: the rows that come next are folded from the first on, onto the state
        the deleted ones left."""
        self.num_folded = 0

    def fold(self, connection: duckdb.DuckDBPyConnection) -> None:
        """Fill the ages of the evictions among the new event rows, in one transaction."""
        first = self.num_folded
        row = connection.execute(
            "SELECT max(rowid) + 1 FROM events WHERE rowid >= ?", [first]
        ).fetchone()
        if row is None or row[0] is None:
            return
        connection.begin()
        try:
            if not self._state_made:
                connection.execute(_CREATE_STATE)
            elif first > 0 and _count(connection, _OUT_OF_ORDER, first):
                connection.execute(_CREATE_STATE)
                first = 0
            connection.execute(_FILL_AGES, {"first": first})
            connection.execute(_FOLD_STATE, {"first": first})
        except BaseException:
            connection.rollback()
            raise
        connection.commit()
        self._state_made = True
        self.num_folded = int(row[0])


def _count(connection: duckdb.DuckDBPyConnection, sql: str, first: int) -> int:
    row = connection.execute(sql, {"first": first}).fetchone()
    return int(row[0]) if row else 0
