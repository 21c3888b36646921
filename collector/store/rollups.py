"""Rollup tables `finalize` builds inside DuckDB, so the app's pages read thousands of rows,
not millions of events.

- `reference_group`: the KV cache group whose blocks the prefix rollups count (below);
- `rollup_grid`: the time grid (at most NUM_TIME_BUCKETS buckets of 1, 2 or 5 x 10^k ns)
  and the block bin size of the heatmap (at most NUM_BLOCK_BINS bins);
- `time_rollup`: per time bucket, every headline figure (lookups, hits, stores, evictions,
  preemptions, drops, collisions, pool state);
- `block_heat`: per time bucket, block bin and KV cache group, hits, stores and evictions;
- `group_rollup`: per time bucket and KV cache group, the blocks allocated, stored, hit and
  evicted, where hits started (their count and the sum of their first positions), and the
  most blocks the group held at once (from pool records that say, per group);
- `cache_lifetimes`: one row per store: when the block hash entered the cache, when it left
  (evicted, cleared by a reset, or still cached at the end), who stored it, and how many
  hits it got meanwhile (each hit goes to its block's latest store before it, while that
  store is cached: the hits the eviction ages count), all on the engine (and DP rank) that
  stored it, and the root of the storing request's prefix family;
- `prefix_blocks`: one row per block hash: its parent, position, hits, stores, evictions,
  first and last use, time cached, the tenant and adapter that first stored it;
- `tenant_sharing`: per time bucket, block hits by hitting tenant x storing tenant (the
  latest store of the block before the hit), with both cache salts;
- `family_hits`: per time bucket and prefix family (the block hashes under one first block),
  block hits and the sum of their positions (for the attention term of compute saved);
- `fleet_states`: on a run of several engines, the fleet's cached and duplicated blocks
  after each change (below).

A hybrid model caches each prefix once per KV cache group (`kv_group`). The block heat and
the lifetimes keep every group's blocks (each holds memory; block ids are the pool's, one
group's at a time). The prefix rollups (`prefix_blocks`, `tenant_sharing`,
`family_hits`) count the reference group only: the run's first full-attention group (else
group 0), the one that reuses a prefix whole, from its first block, so that a prefix's hits
are counted once and its tree has its root.
"""

from __future__ import annotations

NUM_TIME_BUCKETS = 1_000
NUM_BLOCK_BINS = 256

# The run's reference group (see above): its first full-attention group, else group 0.
_REFERENCE_GROUP = """
CREATE OR REPLACE TABLE reference_group AS
SELECT coalesce(list_position(
    CAST(json_extract_string(options, '$.kv_groups[*].kind') AS VARCHAR[]), 'full') - 1, 0
) AS kv_group
FROM runs
"""
# Block rows of the reference group (of a run's event rows, `events` named so).
IN_REFERENCE_GROUP = "coalesce(kv_group, 0) = (SELECT kv_group FROM reference_group)"

_GRID = f"""
CREATE OR REPLACE TABLE rollup_grid AS
WITH span AS (
    SELECT coalesce(min(ts_ns), 0) AS start_ns, coalesce(max(ts_ns), 0) AS end_ns
    FROM (
        SELECT ts_ns FROM events
        UNION ALL SELECT ts_ns FROM pool
        UNION ALL SELECT ts_ns FROM collisions
    )
),
wanted AS (
    SELECT *, greatest((end_ns - start_ns) // {NUM_TIME_BUCKETS} + 1, 1) AS wanted_ns FROM span
),
decade AS (
    SELECT *, CAST(pow(10, floor(log10(wanted_ns))) AS BIGINT) AS decade_ns FROM wanted
)
SELECT
    start_ns,
    end_ns,
    decade_ns * CASE
        WHEN wanted_ns <= decade_ns THEN 1
        WHEN wanted_ns <= 2 * decade_ns THEN 2
        WHEN wanted_ns <= 5 * decade_ns THEN 5
        ELSE 10
    END AS bucket_ns,
    (SELECT greatest(CAST(ceil(num_blocks / {NUM_BLOCK_BINS}) AS INTEGER), 1) FROM runs)
        AS block_bin_size
FROM decade
"""

_TIME_ROLLUP = """
CREATE OR REPLACE TABLE time_rollup AS
WITH event_buckets AS (
    SELECT
        (ts_ns - grid.start_ns) // grid.bucket_ns AS bucket,
        count(*) FILTER (WHERE kind = 'lookup' AND NOT preempted) AS requests,
        sum(num_prompt_tokens) FILTER (WHERE kind = 'lookup' AND NOT preempted)
            AS prompt_tokens,
        sum(num_hit_tokens) FILTER (WHERE kind = 'lookup' AND NOT preempted) AS hit_tokens,
        sum(num_tier_hit_tokens) FILTER (WHERE kind = 'lookup' AND NOT preempted)
            AS tier_hit_tokens,
        sum((num_prompt_tokens + runs.block_size - 1) // runs.block_size)
            FILTER (WHERE kind = 'lookup' AND NOT preempted) AS prompt_blocks,
        sum(num_hit_blocks) FILTER (WHERE kind = 'lookup' AND NOT preempted) AS hit_blocks,
        sum(CAST(num_hit_tokens AS BIGINT) * num_hit_tokens)
            FILTER (WHERE kind = 'lookup' AND NOT preempted) AS hit_tokens_squared,
        sum(CAST(num_prompt_tokens AS BIGINT) * num_prompt_tokens)
            FILTER (WHERE kind = 'lookup' AND NOT preempted) AS prompt_tokens_squared,
        count(*) FILTER (WHERE kind = 'hit') AS block_hits,
        count(*) FILTER (WHERE kind = 'store') AS stores,
        count(*) FILTER (WHERE kind = 'evict') AS evictions,
        count(*) FILTER (WHERE kind = 'preempt') AS preemptions,
        count(*) FILTER (WHERE kind = 'reset') AS resets,
        sum(num_cleared) FILTER (WHERE kind = 'reset') AS cleared_blocks,
        sum(num_lost) FILTER (WHERE kind = 'drop') AS dropped_events,
        count(*) AS event_rows
    FROM events, rollup_grid AS grid, runs
    GROUP BY bucket
),
pool_buckets AS (
    SELECT
        (ts_ns - grid.start_ns) // grid.bucket_ns AS bucket,
        count(*) AS pool_rows,
        min(num_free) AS min_free,
        avg(num_cached_free) AS mean_cached_free,
        avg(num_in_use) AS mean_in_use
    FROM pool, rollup_grid AS grid
    GROUP BY bucket
),
collision_buckets AS (
    SELECT (ts_ns - grid.start_ns) // grid.bucket_ns AS bucket, count(*) AS collisions
    FROM collisions, rollup_grid AS grid
    GROUP BY bucket
)
SELECT
    bucket,
    coalesce(requests, 0) AS requests,
    CAST(coalesce(prompt_tokens, 0) AS BIGINT) AS prompt_tokens,
    CAST(coalesce(hit_tokens, 0) AS BIGINT) AS hit_tokens,
    CAST(coalesce(tier_hit_tokens, 0) AS BIGINT) AS tier_hit_tokens,
    CAST(coalesce(prompt_blocks, 0) AS BIGINT) AS prompt_blocks,
    CAST(coalesce(hit_blocks, 0) AS BIGINT) AS hit_blocks,
    CAST(coalesce(hit_tokens_squared, 0) AS BIGINT) AS hit_tokens_squared,
    CAST(coalesce(prompt_tokens_squared, 0) AS BIGINT) AS prompt_tokens_squared,
    coalesce(block_hits, 0) AS block_hits,
    coalesce(stores, 0) AS stores,
    coalesce(evictions, 0) AS evictions,
    coalesce(preemptions, 0) AS preemptions,
    coalesce(resets, 0) AS resets,
    CAST(coalesce(cleared_blocks, 0) AS BIGINT) AS cleared_blocks,
    CAST(coalesce(dropped_events, 0) AS BIGINT) AS dropped_events,
    coalesce(event_rows, 0) AS event_rows,
    coalesce(pool_rows, 0) AS pool_rows,
    min_free,
    mean_cached_free,
    mean_in_use,
    coalesce(collisions, 0) AS collisions
FROM event_buckets
FULL JOIN pool_buckets USING (bucket)
FULL JOIN collision_buckets USING (bucket)
ORDER BY bucket
"""

_BLOCK_HEAT = """
CREATE OR REPLACE TABLE block_heat AS
SELECT
    (ts_ns - grid.start_ns) // grid.bucket_ns AS bucket,
    block_id // grid.block_bin_size AS block_bin,
    coalesce(kv_group, 0) AS kv_group,
    count(*) FILTER (WHERE kind = 'hit') AS hits,
    count(*) FILTER (WHERE kind = 'store') AS stores,
    count(*) FILTER (WHERE kind = 'evict') AS evictions
FROM events, rollup_grid AS grid
WHERE kind IN ('hit', 'store', 'evict')
GROUP BY ALL
ORDER BY bucket, block_bin
"""

_GROUP_ROLLUP = """
CREATE OR REPLACE TABLE group_rollup AS
WITH event_buckets AS (
    SELECT
        (ts_ns - grid.start_ns) // grid.bucket_ns AS bucket,
        coalesce(kv_group, 0) AS kv_group,
        count(*) FILTER (WHERE kind = 'allocate') AS allocated,
        count(*) FILTER (WHERE kind = 'store') AS stored,
        count(*) FILTER (WHERE kind = 'hit') AS block_hits,
        count(*) FILTER (WHERE kind = 'evict') AS evicted,
        count(*) FILTER (WHERE kind = 'hit' AND pos = 0) AS hit_starts,
        sum(block_position) FILTER (WHERE kind = 'hit' AND pos = 0) AS hit_start_positions
    FROM events, rollup_grid AS grid
    WHERE kind IN ('allocate', 'store', 'hit', 'evict')
    GROUP BY ALL
),
pool_buckets AS (
    SELECT bucket, kv_group, max(in_use) AS peak_in_use
    FROM (
        SELECT (ts_ns - grid.start_ns) // grid.bucket_ns AS bucket,
            unnest(num_in_use_by_group) AS in_use,
            unnest(range(len(num_in_use_by_group))) AS kv_group
        FROM pool, rollup_grid AS grid
        WHERE num_in_use_by_group IS NOT NULL
    )
    GROUP BY ALL
)
SELECT
    bucket,
    kv_group,
    coalesce(allocated, 0) AS allocated,
    coalesce(stored, 0) AS stored,
    coalesce(block_hits, 0) AS block_hits,
    coalesce(evicted, 0) AS evicted,
    coalesce(hit_starts, 0) AS hit_starts,
    CAST(coalesce(hit_start_positions, 0) AS BIGINT) AS hit_start_positions,
    peak_in_use
FROM event_buckets
FULL JOIN pool_buckets USING (bucket, kv_group)
ORDER BY bucket, kv_group
"""


# `cache_lifetimes`, from every event row (`first_row` 0), or carried over from the previous
# copy of a run being written (`carried`, collector/store/copy_carry.py): its closed
# lifetimes as they were, its open ones and the stores from event row `first_row` on
# matched to the evictions, resets and hits from that row on. A hit goes to its block's
# latest store before it, while that store is cached (the eviction ages count the same
# hits), so a closed lifetime is final.
def cache_lifetimes_statement(first_row: int = 0, carried: str | None = None) -> str:
    """The statement that builds `cache_lifetimes` (above); `carried` names the previous
    table whose lifetimes stand as they were up to event row `first_row`."""
    fresh = f"AND rowid >= {int(first_row)}" if carried else ""
    of_new_stores = "AND request_id IN (SELECT request_id FROM new_stores)" if carried else ""
    still_open = (
        f"""UNION ALL
        SELECT engine, rank, store_seq, stored_ns, block_id, block_hash, parent_hash,
            block_position, kv_group, stored_by, tenant, lora, salt_hash, root_hash, hits
        FROM {carried} WHERE ended_by IS NULL"""
        if carried
        else ""
    )
    closed = f"UNION ALL SELECT * FROM {carried} WHERE ended_by IS NOT NULL" if carried else ""
    order = "" if carried else "ORDER BY engine, rank, store_seq, block_position"
    return f"""
CREATE OR REPLACE TABLE cache_lifetimes AS
WITH engine_events AS (
    -- Block ids and record numbers hold within one engine (and DP rank) only.
    SELECT seq, ts_ns, kind, block_id, block_hash, parent_hash, block_position, request_id,
        coalesce(engine_id, '') AS engine, coalesce(dp_rank, 0) AS rank,
        coalesce(kv_group, 0) AS kv_group
    FROM events
    WHERE kind IN ('store', 'evict', 'reset', 'hit') {fresh}
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
resets AS (SELECT engine, rank, seq, ts_ns FROM engine_events WHERE kind = 'reset'),
ended AS (
    SELECT stores.*,
        evictions.seq IS NOT NULL AND (resets.seq IS NULL OR evictions.seq < resets.seq)
            AS evicted,
        CASE WHEN evicted THEN 'evict' WHEN resets.seq IS NOT NULL THEN 'reset' END
            AS ended_by,
        CASE WHEN evicted THEN evictions.seq ELSE resets.seq END AS ended_seq,
        CASE WHEN evicted THEN evictions.ts_ns ELSE resets.ts_ns END AS ended_at
    FROM stores
    ASOF LEFT JOIN evictions
        ON stores.engine = evictions.engine AND stores.rank = evictions.rank
        AND stores.block_id = evictions.block_id AND evictions.seq > stores.store_seq
    ASOF LEFT JOIN resets
        ON stores.engine = resets.engine AND stores.rank = resets.rank
        AND resets.seq > stores.store_seq
),
hits AS (SELECT engine, rank, seq, block_id FROM engine_events WHERE kind = 'hit'),
lifetime_hits AS (
    SELECT ended.engine, ended.rank, ended.store_seq, ended.block_id, count(*) AS new_hits
    FROM hits
    ASOF JOIN ended
        ON hits.engine = ended.engine AND hits.rank = ended.rank
        AND hits.block_id = ended.block_id AND ended.store_seq < hits.seq
    WHERE ended.ended_seq IS NULL OR hits.seq < ended.ended_seq
    GROUP BY ALL
)
SELECT
    block_hash, parent_hash, block_position, block_id, kv_group, store_seq, stored_ns,
    coalesce(ended_at, grid.end_ns) AS ended_ns, ended_by, stored_by, tenant, lora,
    salt_hash, root_hash, hits + coalesce(new_hits, 0) AS hits, engine, rank
FROM ended
LEFT JOIN lifetime_hits USING (engine, rank, store_seq, block_id)
CROSS JOIN rollup_grid AS grid
{closed}
{order}
"""


_PREFIX_BLOCKS = f"""
CREATE OR REPLACE TABLE prefix_blocks AS
WITH stored AS (
    SELECT
        block_hash,
        any_value(parent_hash) AS parent_hash,
        min(block_position) AS block_position,
        count(*) AS stores,
        arg_min(tenant, store_seq) AS tenant,
        arg_min(lora, store_seq) AS lora,
        arg_min(root_hash, store_seq) AS root_hash,
        arg_min(stored_by, store_seq) AS first_stored_by,
        min(stored_ns) AS first_stored_ns,
        sum(ended_ns - stored_ns) AS cached_ns
    FROM cache_lifetimes
    WHERE {IN_REFERENCE_GROUP}
    GROUP BY block_hash
),
used AS (
    SELECT
        block_hash,
        count(*) FILTER (WHERE kind = 'hit') AS hits,
        count(*) FILTER (WHERE kind = 'evict') AS evictions,
        min(block_position) FILTER (WHERE kind = 'hit') AS hit_position,
        min(ts_ns) FILTER (WHERE kind IN ('hit', 'store')) AS first_use_ns,
        max(ts_ns) FILTER (WHERE kind IN ('hit', 'store')) AS last_use_ns
    FROM events
    WHERE kind IN ('hit', 'store', 'evict')
        AND {IN_REFERENCE_GROUP}
    GROUP BY block_hash
)
SELECT
    used.block_hash,
    stored.parent_hash,
    coalesce(stored.block_position, used.hit_position) AS block_position,
    used.hits,
    coalesce(stored.stores, 0) AS stores,
    used.evictions,
    used.first_use_ns,
    used.last_use_ns,
    stored.tenant,
    stored.lora,
    stored.root_hash,
    stored.first_stored_by,
    stored.first_stored_ns,
    CAST(coalesce(stored.cached_ns, 0) AS BIGINT) AS cached_ns
FROM used
LEFT JOIN stored USING (block_hash)
ORDER BY used.hits DESC, block_position, used.block_hash
"""

_TENANT_SHARING = f"""
CREATE OR REPLACE TABLE tenant_sharing AS
WITH hits AS (
    SELECT seq, ts_ns, block_id, request_id,
        coalesce(engine_id, '') AS engine, coalesce(dp_rank, 0) AS rank
    FROM events
    WHERE kind = 'hit' AND {IN_REFERENCE_GROUP}
)
SELECT
    (hits.ts_ns - grid.start_ns) // grid.bucket_ns AS bucket,
    cache_lifetimes.tenant AS stored_tenant,
    cache_lifetimes.lora AS stored_lora,
    cache_lifetimes.salt_hash AS stored_salt,
    requests.tenant AS hit_tenant,
    requests.lora AS hit_lora,
    requests.salt_hash AS hit_salt,
    count(*) AS block_hits
FROM hits
ASOF LEFT JOIN cache_lifetimes
    ON hits.engine = cache_lifetimes.engine AND hits.rank = cache_lifetimes.rank
    AND hits.block_id = cache_lifetimes.block_id AND cache_lifetimes.store_seq < hits.seq
LEFT JOIN requests ON requests.request_id = hits.request_id
CROSS JOIN rollup_grid AS grid
GROUP BY ALL
ORDER BY ALL
"""

_FAMILY_HITS = f"""
CREATE OR REPLACE TABLE family_hits AS
SELECT
    (events.ts_ns - grid.start_ns) // grid.bucket_ns AS bucket,
    prefix_blocks.root_hash,
    count(*) AS block_hits,
    sum(events.block_position) AS position_hits
FROM events
JOIN prefix_blocks USING (block_hash)
CROSS JOIN rollup_grid AS grid
WHERE events.kind = 'hit' AND {IN_REFERENCE_GROUP}
GROUP BY ALL
ORDER BY bucket, prefix_blocks.root_hash
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
def fleet_states_statement(since_ns: int | None = None, carried: str | None = None) -> str:
    """The statement that builds `fleet_states` (above); with `carried`, the previous table,
    whose states before `since_ns` stand (no lifetime that begins or ends before it
    changed): the states from `since_ns` on are derived from the lifetimes cached then or
    after, cut to begin there, and the state at `since_ns` kept only where a lifetime
    really begins or ends (copy_carry.py)."""
    cut = (
        f"""SELECT engine_id, dp_rank, block_hash, kv_group,
            greatest(stored_ns, {since_ns}) AS stored_ns, ended_ns
        FROM whole_lifetimes WHERE ended_ns > {since_ns}"""
        if carried
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
    kept AS (SELECT * FROM {carried} WHERE ts_ns < {since_ns})
    SELECT ts_ns,
        CASE WHEN ts_ns = (SELECT max(ts_ns) FROM kept) THEN coalesce(
            (SELECT min(ts_ns) FROM new_states), (SELECT end_ns FROM fleet_span)
        ) ELSE until_ns END AS until_ns,
        cached_blocks, duplicated_hashes, duplicated_blocks
    FROM kept
    UNION ALL
    SELECT * FROM new_states"""
        if carried
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


# In build order: each may read the ones before it (and the `requests` table).
ROLLUP_STATEMENTS = (
    _REFERENCE_GROUP,
    _GRID,
    _TIME_ROLLUP,
    _BLOCK_HEAT,
    _GROUP_ROLLUP,
    cache_lifetimes_statement(),
    _PREFIX_BLOCKS,
    _TENANT_SHARING,
    _FAMILY_HITS,
    fleet_states_statement(),
)
