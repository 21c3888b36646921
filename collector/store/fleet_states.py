"""The fleet's states (`fleet_states`), derived from the cache lifetimes
(lifetime_rollups.py), built from every event row (`WHOLE_FLEET_STATES`) or carried over
from the copy before of a run being written (copy_carry.py, `CARRIED_FLEET_STATES`: its
database attached as `previous_copy`, the states before the parameter `$since_ns` kept).
"""

from __future__ import annotations

# `fleet_states`: on a run of several engines (none on one), the fleet's cache after each
# moment it changed: `cached_blocks` (every copy on every engine), `duplicated_hashes` (hashes
# held by more than one engine) and `duplicated_blocks` (the copies beyond the first
# engine's: engines holding the hash - 1), each holding from `ts_ns` until `until_ns`. A hash
# (with its KV cache group) is cached on an engine for one of its `cache_lifetimes` (from a
# store until that engine evicts the block or resets; a lifetime still open at the run's end
# lasts to just past its last record). Counted as interval endpoints and running sums: copies
# per engine and hash, then engines per hash, then the fleet. Built with the rollups because
# it takes minutes at 100 million events (benchmarks/large_run.py); a time window's states
# are these cut to the window (collector/queries/fleet.py).
_WHOLE_LIFETIMES = """
    fleet_span AS (
        -- the run's first record to just past its last, as a whole-run timeline spans it
        SELECT min(ts_ns) AS start_ns, max(ts_ns) + 1 AS end_ns
        FROM (SELECT ts_ns FROM events UNION ALL SELECT ts_ns FROM pool)
    ),
    whole_lifetimes AS (
        SELECT engine AS engine_id, rank AS dp_rank, block_hash, kv_group,
            greatest(stored_ns, span.start_ns) AS stored_ns,
            CASE WHEN ended_by IS NULL THEN span.end_ns ELSE least(ended_ns, span.end_ns) END
                AS ended_ns
        FROM cache_lifetimes, fleet_span AS span
        WHERE stored_ns < span.end_ns
            AND (SELECT count(DISTINCT (engine, rank)) FROM cache_lifetimes) > 1
    )"""
# The fleet's states (`states`) from the lifetimes in `lifetimes`.
_STATES = """
    changes AS (
        SELECT engine_id, dp_rank, block_hash, kv_group, stored_ns AS ts_ns, 1 AS change
        FROM lifetimes WHERE ended_ns > stored_ns
        UNION ALL
        SELECT engine_id, dp_rank, block_hash, kv_group, ended_ns, -1
        FROM lifetimes WHERE ended_ns > stored_ns
    ),
    copies AS (
        SELECT engine_id, dp_rank, block_hash, kv_group, ts_ns, sum(change) AS change,
            sum(sum(change)) OVER (
                PARTITION BY engine_id, dp_rank, block_hash, kv_group ORDER BY ts_ns
            ) > 0 AS held
        FROM changes GROUP BY engine_id, dp_rank, block_hash, kv_group, ts_ns
    ),
    holders AS (
        SELECT block_hash, kv_group, ts_ns, change,
            held::INTEGER - coalesce(lag(held::INTEGER) OVER (
                PARTITION BY engine_id, dp_rank, block_hash, kv_group ORDER BY ts_ns
            ), 0) AS holder_change
        FROM copies
    ),
    spread AS (
        SELECT block_hash, kv_group, ts_ns, sum(change) AS change,
            sum(sum(holder_change)) OVER (
                PARTITION BY block_hash, kv_group ORDER BY ts_ns
            ) AS holders
        FROM holders GROUP BY block_hash, kv_group, ts_ns
    ),
    hash_changes AS (
        SELECT ts_ns, change,
            greatest(holders - 1, 0) - coalesce(lag(greatest(holders - 1, 0)) OVER by_hash, 0)
                AS extra_change,
            (holders > 1)::INTEGER - coalesce(lag((holders > 1)::INTEGER) OVER by_hash, 0)
                AS duplicated_change
        FROM spread
        WINDOW by_hash AS (PARTITION BY block_hash, kv_group ORDER BY ts_ns)
    ),
    states AS (
        SELECT ts_ns,
            sum(sum(change)) OVER by_time AS cached_blocks,
            sum(sum(duplicated_change)) OVER by_time AS duplicated_hashes,
            sum(sum(extra_change)) OVER by_time AS duplicated_blocks,
            coalesce(lead(ts_ns) OVER by_time, (SELECT end_ns FROM fleet_span)) AS until_ns
        FROM hash_changes GROUP BY ts_ns
        WINDOW by_time AS (ORDER BY ts_ns)
    )"""

WHOLE_FLEET_STATES = f"""
CREATE OR REPLACE TABLE fleet_states AS
    WITH {_WHOLE_LIFETIMES},
    lifetimes AS (SELECT * FROM whole_lifetimes),
    {_STATES}
    SELECT ts_ns, until_ns, cached_blocks, duplicated_hashes, duplicated_blocks
    FROM states
    ORDER BY ts_ns
"""

# Carried: the copy before's states before `$since_ns` stand (no lifetime that begins or
# ends before it changed); those from `$since_ns` on are derived from the lifetimes cached
# then or after, cut to begin there, the state at `$since_ns` kept only where a lifetime
# really begins or ends.
CARRIED_FLEET_STATES = f"""
CREATE OR REPLACE TABLE fleet_states AS
    WITH {_WHOLE_LIFETIMES},
    lifetimes AS (
        SELECT engine_id, dp_rank, block_hash, kv_group,
            greatest(stored_ns, CAST($since_ns AS BIGINT)) AS stored_ns, ended_ns
        FROM whole_lifetimes WHERE ended_ns > $since_ns
    ),
    {_STATES},
    new_states AS (
        SELECT ts_ns, until_ns, cached_blocks, duplicated_hashes, duplicated_blocks
        FROM states
        WHERE ts_ns > $since_ns OR EXISTS (
            SELECT 1 FROM whole_lifetimes
            WHERE ended_ns > stored_ns AND (stored_ns = $since_ns OR ended_ns = $since_ns)
        )
    ),
    kept AS (SELECT * FROM previous_copy.fleet_states WHERE ts_ns < $since_ns)
    SELECT ts_ns,
        CASE WHEN ts_ns = (SELECT max(ts_ns) FROM kept) THEN coalesce(
            (SELECT min(ts_ns) FROM new_states), (SELECT end_ns FROM fleet_span)
        ) ELSE until_ns END AS until_ns,
        cached_blocks, duplicated_hashes, duplicated_blocks
    FROM kept
    UNION ALL
    SELECT * FROM new_states
"""
