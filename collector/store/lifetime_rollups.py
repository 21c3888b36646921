"""The rollups derived from the cache lifetimes (rollups.py lists them all): `cache_lifetimes`,
`prefix_blocks`, `tenant_sharing` and `fleet_states`, each built from every event row, or
carried over from the copy before of a run being written (copy_carry.py): `previous` names
that copy's attached database, whose tables stand as they were for the event rows before
`first_row`, and only what the rows from `first_row` on change is derived again.

A hit goes to its block's latest store before it, while that store is cached (the hits the
eviction ages count, eviction_ages.py), so a lifetime that has ended is final. The lifetimes
step leaves each hit's store in a temporary table, `hit_stores` (the new hits only, when
carried), for `tenant_sharing`, which drops it.
"""

from __future__ import annotations

from collector.store.reference_group import IN_REFERENCE_GROUP


def cache_lifetimes_statement(first_row: int = 0, previous: str | None = None) -> str:
    """The statements that build `cache_lifetimes` (and `temp.hit_stores`): carried from
    `previous`, its closed lifetimes as they were, and its open ones and the stores from
    event row `first_row` on matched to the evictions, resets and hits from that row on."""
    fresh = f"AND rowid >= {int(first_row)}" if previous else ""
    of_new_stores = "AND request_id IN (SELECT request_id FROM new_stores)" if previous else ""
    still_open = (
        f"""UNION ALL
        SELECT engine, rank, store_seq, stored_ns, block_id, block_hash, parent_hash,
            block_position, kv_group, stored_by, tenant, lora, salt_hash, root_hash, hits
        FROM {previous}.cache_lifetimes WHERE ended_by IS NULL"""
        if previous
        else ""
    )
    closed = (
        f"UNION ALL SELECT * FROM {previous}.cache_lifetimes WHERE ended_by IS NOT NULL"
        if previous
        else ""
    )
    order = "" if previous else "ORDER BY engine, rank, store_seq, block_position"
    return f"""
CREATE OR REPLACE TEMP TABLE lifetime_ends AS
WITH engine_events AS (
    -- Block ids and record numbers hold within one engine (and DP rank) only.
    SELECT seq, ts_ns, kind, block_id, block_hash, parent_hash, block_position, request_id,
        coalesce(engine_id, '') AS engine, coalesce(dp_rank, 0) AS rank,
        coalesce(kv_group, 0) AS kv_group
    FROM events
    WHERE kind IN ('store', 'evict', 'reset') {fresh}
),
new_stores AS (SELECT * FROM engine_events WHERE kind = 'store'),
request_roots AS (
    -- the first block of a request in the reference group: the root of its prefix family
    SELECT request_id, any_value(block_hash) AS root_hash
    FROM events
    WHERE kind IN ('hit', 'store') AND block_position = 0 AND {IN_REFERENCE_GROUP}
        {of_new_stores}
    GROUP BY request_id
),
stores AS (
    SELECT engine, rank, seq AS store_seq, ts_ns AS stored_ns, block_id, block_hash,
        parent_hash, block_position, kv_group, request_id AS stored_by, requests.tenant,
        requests.lora, requests.salt_hash, request_roots.root_hash, 0 AS hits
    FROM new_stores
    LEFT JOIN requests USING (request_id)
    LEFT JOIN request_roots USING (request_id)
    {still_open}
),
evictions AS (SELECT engine, rank, seq, ts_ns, block_id FROM engine_events WHERE kind = 'evict'),
resets AS (SELECT engine, rank, seq, ts_ns FROM engine_events WHERE kind = 'reset')
SELECT stores.*,
    evictions.seq IS NOT NULL AND (resets.seq IS NULL OR evictions.seq < resets.seq) AS evicted,
    CASE WHEN evicted THEN 'evict' WHEN resets.seq IS NOT NULL THEN 'reset' END AS ended_by,
    CASE WHEN evicted THEN evictions.seq ELSE resets.seq END AS ended_seq,
    CASE WHEN evicted THEN evictions.ts_ns ELSE resets.ts_ns END AS ended_at
FROM stores
ASOF LEFT JOIN evictions
    ON stores.engine = evictions.engine AND stores.rank = evictions.rank
    AND stores.block_id = evictions.block_id AND evictions.seq > stores.store_seq
ASOF LEFT JOIN resets
    ON stores.engine = resets.engine AND stores.rank = resets.rank
    AND resets.seq > stores.store_seq;

CREATE OR REPLACE TEMP TABLE hit_stores AS
WITH hits AS (
    SELECT seq, ts_ns, request_id, block_id, coalesce(kv_group, 0) AS kv_group,
        coalesce(engine_id, '') AS engine, coalesce(dp_rank, 0) AS rank
    FROM events
    WHERE kind = 'hit' {fresh}
)
SELECT hits.*,
    ends.store_seq IS NOT NULL AND (ends.ended_seq IS NULL OR hits.seq < ends.ended_seq)
        AS cached,
    CASE WHEN cached THEN ends.store_seq END AS store_seq,
    CASE WHEN cached THEN ends.tenant END AS stored_tenant,
    CASE WHEN cached THEN ends.lora END AS stored_lora,
    CASE WHEN cached THEN ends.salt_hash END AS stored_salt
FROM hits
ASOF LEFT JOIN temp.lifetime_ends AS ends
    ON hits.engine = ends.engine AND hits.rank = ends.rank
    AND hits.block_id = ends.block_id AND ends.store_seq < hits.seq;

CREATE OR REPLACE TABLE cache_lifetimes AS
WITH lifetime_hits AS (
    SELECT engine, rank, store_seq, block_id, count(*) AS new_hits
    FROM temp.hit_stores
    WHERE cached
    GROUP BY ALL
)
SELECT
    block_hash, parent_hash, block_position, block_id, kv_group, store_seq, stored_ns,
    coalesce(ended_at, grid.end_ns) AS ended_ns, ended_by, stored_by, tenant, lora,
    salt_hash, root_hash, hits + coalesce(new_hits, 0) AS hits, engine, rank
FROM temp.lifetime_ends
LEFT JOIN lifetime_hits USING (engine, rank, store_seq, block_id)
CROSS JOIN rollup_grid AS grid
{closed}
{order};

DROP TABLE temp.lifetime_ends
"""


# A block hash's figures from its lifetimes (in the reference group), of the hashes `WHERE`;
# its first store: the earliest (ties by engine, DP rank and record number).
def _stored(where: str) -> str:
    return f"""
    SELECT
        block_hash,
        any_value(parent_hash) AS parent_hash,
        min(block_position) AS block_position,
        count(*) AS stores,
        arg_min(
            {{'tenant': tenant, 'lora': lora, 'root_hash': root_hash, 'stored_by': stored_by}},
            (stored_ns, engine, rank, store_seq)
        ) AS first_store,
        min(stored_ns) AS first_stored_ns,
        sum(ended_ns - stored_ns) AS cached_ns
    FROM cache_lifetimes
    WHERE {IN_REFERENCE_GROUP} {where}
    GROUP BY block_hash"""


# A block hash's figures from its events (in the reference group), of the rows `WHERE`.
def _used(where: str) -> str:
    return f"""
    SELECT
        block_hash,
        count(*) FILTER (WHERE kind = 'hit') AS hits,
        count(*) FILTER (WHERE kind = 'evict') AS evictions,
        min(block_position) FILTER (WHERE kind = 'hit') AS hit_position,
        min(ts_ns) FILTER (WHERE kind IN ('hit', 'store')) AS first_use_ns,
        max(ts_ns) FILTER (WHERE kind IN ('hit', 'store')) AS last_use_ns
    FROM events
    WHERE kind IN ('hit', 'store', 'evict') AND {IN_REFERENCE_GROUP} {where}
    GROUP BY block_hash"""


_PREFIX_BLOCK = """
    used.block_hash,
    stored.parent_hash,
    coalesce(stored.block_position, used.hit_position) AS block_position,
    used.hits,
    coalesce(stored.stores, 0) AS stores,
    used.evictions,
    used.first_use_ns,
    used.last_use_ns,
    stored.first_store.tenant,
    stored.first_store.lora,
    stored.first_store.root_hash,
    stored.first_store.stored_by AS first_stored_by,
    stored.first_stored_ns,
    CAST(coalesce(stored.cached_ns, 0) AS BIGINT) AS cached_ns
"""


def prefix_blocks_statement(first_row: int = 0, previous: str | None = None) -> str:
    """The statement that builds `prefix_blocks`: carried from `previous`, the hashes the
    new rows or an open lifetime touch are figured again (their lifetimes whole, their
    events' counts added to the previous ones), and every other hash's row stands."""
    if previous is None:
        return f"""
CREATE OR REPLACE TABLE prefix_blocks AS
WITH stored AS ({_stored("")}),
used AS ({_used("")})
SELECT {_PREFIX_BLOCK}
FROM used
LEFT JOIN stored USING (block_hash)
ORDER BY used.hits DESC, block_position, used.block_hash
"""
    return f"""
CREATE OR REPLACE TABLE prefix_blocks AS
WITH new_used AS ({_used(f"AND rowid >= {int(first_row)}")}),
touched AS (
    SELECT block_hash FROM new_used
    UNION
    SELECT block_hash FROM {previous}.cache_lifetimes
    WHERE ended_by IS NULL AND {IN_REFERENCE_GROUP}
),
stored AS ({_stored("AND block_hash IN (SELECT block_hash FROM touched)")}),
before AS (
    SELECT * FROM {previous}.prefix_blocks WHERE block_hash IN (SELECT block_hash FROM touched)
),
used AS (
    -- a hash stored before has its stored position; one never stored, its least hit one
    SELECT block_hash,
        coalesce(before.hits, 0) + coalesce(new_used.hits, 0) AS hits,
        coalesce(before.evictions, 0) + coalesce(new_used.evictions, 0) AS evictions,
        CASE WHEN coalesce(before.stores, 0) = 0
            THEN least(before.block_position, new_used.hit_position)
        END AS hit_position,
        least(before.first_use_ns, new_used.first_use_ns) AS first_use_ns,
        greatest(before.last_use_ns, new_used.last_use_ns) AS last_use_ns
    FROM before
    FULL JOIN new_used USING (block_hash)
)
SELECT {_PREFIX_BLOCK}
FROM used
LEFT JOIN stored USING (block_hash)
UNION ALL
SELECT * FROM {previous}.prefix_blocks
ANTI JOIN touched USING (block_hash)
"""


def tenant_sharing_statement(previous: str | None = None) -> str:
    """The statements that build `tenant_sharing` from `temp.hit_stores` (and drop it): the
    new hits' counts added to `previous`'s, when carried."""
    new = f"""
    SELECT
        (hits.ts_ns - grid.start_ns) // grid.bucket_ns AS bucket,
        hits.stored_tenant,
        hits.stored_lora,
        hits.stored_salt,
        requests.tenant AS hit_tenant,
        requests.lora AS hit_lora,
        requests.salt_hash AS hit_salt,
        count(*) AS block_hits
    FROM temp.hit_stores AS hits
    LEFT JOIN requests USING (request_id)
    CROSS JOIN rollup_grid AS grid
    WHERE {IN_REFERENCE_GROUP}
    GROUP BY ALL"""
    if previous is not None:
        new = f"""
    SELECT * EXCLUDE (block_hits), CAST(sum(block_hits) AS BIGINT) AS block_hits
    FROM ({new} UNION ALL SELECT * FROM {previous}.tenant_sharing)
    GROUP BY ALL"""
    return f"""
CREATE OR REPLACE TABLE tenant_sharing AS
{new}
ORDER BY ALL;

DROP TABLE temp.hit_stores
"""


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
def fleet_states_statement(since_ns: int | None = None, previous: str | None = None) -> str:
    """The statement that builds `fleet_states` (above): from `previous`, whose states
    before `since_ns` stand (no lifetime that begins or ends before it changed), the states
    from `since_ns` on are derived from the lifetimes cached then or after, cut to begin
    there, the state at `since_ns` kept only where a lifetime really begins or ends."""
    cut = (
        f"""SELECT engine_id, dp_rank, block_hash, kv_group,
            greatest(stored_ns, {since_ns}) AS stored_ns, ended_ns
        FROM whole_lifetimes WHERE ended_ns > {since_ns}"""
        if previous
        else "SELECT * FROM whole_lifetimes"
    )
    result = (
        f""",
    new_states AS (
        SELECT ts_ns, until_ns, cached_blocks, duplicated_hashes, duplicated_blocks
        FROM states
        WHERE ts_ns > {since_ns} OR EXISTS (
            SELECT 1 FROM whole_lifetimes
            WHERE ended_ns > stored_ns AND (stored_ns = {since_ns} OR ended_ns = {since_ns})
        )
    ),
    kept AS (SELECT * FROM {previous}.fleet_states WHERE ts_ns < {since_ns})
    SELECT ts_ns,
        CASE WHEN ts_ns = (SELECT max(ts_ns) FROM kept) THEN coalesce(
            (SELECT min(ts_ns) FROM new_states), (SELECT end_ns FROM fleet_span)
        ) ELSE until_ns END AS until_ns,
        cached_blocks, duplicated_hashes, duplicated_blocks
    FROM kept
    UNION ALL
    SELECT * FROM new_states"""
        if previous
        else """SELECT ts_ns, until_ns, cached_blocks, duplicated_hashes, duplicated_blocks
    FROM states
    ORDER BY ts_ns"""
    )
    return f"""
CREATE OR REPLACE TABLE fleet_states AS
    WITH fleet_span AS (
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
    ),
    lifetimes AS ({cut}),
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
    )
    {result}
"""
