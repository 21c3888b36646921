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
- `tenant_sharing`: per time bucket, block hits by hitting tenant x storing tenant (of the
  store the hit went to: its block's latest, still cached), with both cache salts;
- `family_hits`: per time bucket and prefix family (the block hashes under one first block),
  block hits and the sum of their positions (for the attention term of compute saved);
- `fleet_states`: on a run of several engines, the fleet's cached and duplicated blocks
  after each change.

The lifetimes and the rollups derived from them (`prefix_blocks`, `tenant_sharing`,
`fleet_states`) are built in lifetime_rollups.py and fleet_states.py, whole here and carried
over from one live copy to the next (copy_carry.py).

A hybrid model caches each prefix once per KV cache group (`kv_group`). The block heat and
the lifetimes keep every group's blocks (each holds memory; block ids are the pool's, one
group's at a time). The prefix rollups (`prefix_blocks`, `tenant_sharing`,
`family_hits`) count the reference group only: the run's first full-attention group (else
group 0), the one that reuses a prefix whole, from its first block, so that a prefix's hits
are counted once and its tree has its root.
"""

from __future__ import annotations

from collector.store.fleet_states import WHOLE_FLEET_STATES
from collector.store.lifetime_rollups import (
    WHOLE_CACHE_LIFETIMES,
    WHOLE_PREFIX_BLOCKS,
    WHOLE_TENANT_SHARING,
)
from collector.store.reference_group import IN_REFERENCE_GROUP, REFERENCE_GROUP_STATEMENT

NUM_TIME_BUCKETS = 1_000
NUM_BLOCK_BINS = 256

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


# In build order: each may read the ones before it (and the `requests` table).
ROLLUP_STATEMENTS = (
    REFERENCE_GROUP_STATEMENT,
    _GRID,
    _TIME_ROLLUP,
    _BLOCK_HEAT,
    _GROUP_ROLLUP,
    WHOLE_CACHE_LIFETIMES,
    WHOLE_PREFIX_BLOCKS,
    WHOLE_TENANT_SHARING,
    _FAMILY_HITS,
    WHOLE_FLEET_STATES,
)
