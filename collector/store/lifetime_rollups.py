"""The rollups derived from the cache lifetimes (rollups.py lists them all): `cache_lifetimes`,
`prefix_blocks` and `tenant_sharing` (`fleet_states` too, fleet_states.py), each built from
every event row (the `WHOLE_` statements), or carried over from the copy before of a run
being written (copy_carry.py, the `CARRIED_` statements): they read that copy's database,
attached as `previous_copy` (PREVIOUS_COPY), whose tables stand as they were for the event
rows before the parameter `$first_row`, and derive again only what the rows from
`$first_row` on change.

A hit goes to its block's latest store before it, while that store is cached (the hits the
eviction ages count, eviction_ages.py), so a lifetime that has ended is final. The lifetimes
step leaves each hit's store in a temporary table, `hit_stores` (the new hits only, when
carried), for `tenant_sharing`, which drops it.

DuckDB takes parameters in the last statement of a string only, so each carried statement
that takes one stands alone.
"""

from __future__ import annotations

from collector.store.reference_group import IN_REFERENCE_GROUP

PREVIOUS_COPY = "previous_copy"  # the name the carried statements read the copy before by

# -- cache_lifetimes ----------------------------------------------------------------------

# Block ids and record numbers hold within one engine (and DP rank) only.
ENGINE_EVENTS = """
    SELECT seq, ts_ns, kind, block_id, block_hash, parent_hash, block_position, request_id,
        coalesce(engine_id, '') AS engine, coalesce(dp_rank, 0) AS rank,
        coalesce(kv_group, 0) AS kv_group
    FROM events
    WHERE kind IN ('store', 'evict', 'reset')"""
# the first block of a request in the reference group: the root of its prefix family
_REQUEST_ROOTS = f"""
    SELECT request_id, any_value(block_hash) AS root_hash
    FROM events
    WHERE kind IN ('hit', 'store') AND block_position = 0 AND {IN_REFERENCE_GROUP}"""
_NEW_STORES = """
    SELECT engine, rank, seq AS store_seq, ts_ns AS stored_ns, block_id, block_hash,
        parent_hash, block_position, kv_group, request_id AS stored_by, requests.tenant,
        requests.lora, requests.salt_hash, request_roots.root_hash, 0 AS hits
    FROM new_stores
    LEFT JOIN requests USING (request_id)
    LEFT JOIN request_roots USING (request_id)"""
# Each store (`stores`) matched to the eviction of its block or the reset that ended it.
STORE_ENDS = """
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
    AND resets.seq > stores.store_seq"""
_HITS = """
    SELECT seq, ts_ns, request_id, block_id, coalesce(kv_group, 0) AS kv_group,
        coalesce(engine_id, '') AS engine, coalesce(dp_rank, 0) AS rank
    FROM events
    WHERE kind = 'hit'"""
# Each hit (`hits`) matched to its block's latest store before it, while that is cached.
_HIT_STORES = """
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
    AND hits.block_id = ends.block_id AND ends.store_seq < hits.seq"""
# The lifetimes of `lifetime_ends` with the hits `hit_stores` gave them.
_LIFETIMES = """
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
    salt_hash, root_hash, hits + coalesce(new_hits, 0) AS hits, engine, rank, ended_seq
FROM temp.lifetime_ends
LEFT JOIN lifetime_hits USING (engine, rank, store_seq, block_id)
CROSS JOIN rollup_grid AS grid"""

# `cache_lifetimes` (and `temp.hit_stores`) from every event row.
WHOLE_CACHE_LIFETIMES = f"""
CREATE OR REPLACE TEMP TABLE lifetime_ends AS
WITH engine_events AS ({ENGINE_EVENTS}),
new_stores AS (SELECT * FROM engine_events WHERE kind = 'store'),
request_roots AS ({_REQUEST_ROOTS}
    GROUP BY request_id
),
stores AS ({_NEW_STORES}),
{STORE_ENDS};

CREATE OR REPLACE TEMP TABLE hit_stores AS
WITH hits AS ({_HITS})
{_HIT_STORES};

{_LIFETIMES}
ORDER BY engine, rank, store_seq, block_position;

DROP TABLE temp.lifetime_ends
"""

# Carried, in three statements: the open lifetimes of the copy before and the stores from
# event row `$first_row` on, matched to the evictions and resets from that row on; the hits
# from that row on matched to them; then the copy before's closed lifetimes as they were
# and these, with their hits.
CARRIED_LIFETIME_ENDS = f"""
CREATE OR REPLACE TEMP TABLE lifetime_ends AS
WITH engine_events AS ({ENGINE_EVENTS}
        AND rowid >= $first_row
),
new_stores AS (SELECT * FROM engine_events WHERE kind = 'store'),
request_roots AS ({_REQUEST_ROOTS}
        AND request_id IN (SELECT request_id FROM new_stores)
    GROUP BY request_id
),
stores AS ({_NEW_STORES}
    UNION ALL
    SELECT engine, rank, store_seq, stored_ns, block_id, block_hash, parent_hash,
        block_position, kv_group, stored_by, tenant, lora, salt_hash, root_hash, hits
    FROM previous_copy.cache_lifetimes WHERE ended_by IS NULL
),
{STORE_ENDS}
"""
CARRIED_HIT_STORES = f"""
CREATE OR REPLACE TEMP TABLE hit_stores AS
WITH hits AS ({_HITS} AND rowid >= $first_row)
{_HIT_STORES}
"""
CARRIED_CACHE_LIFETIMES = f"""
{_LIFETIMES}
UNION ALL SELECT * FROM previous_copy.cache_lifetimes WHERE ended_by IS NOT NULL;

DROP TABLE temp.lifetime_ends
"""

# -- prefix_blocks ------------------------------------------------------------------------

# A block hash's figures from its lifetimes (in the reference group), of the hashes `WHERE`;
# its first store: the earliest (ties by engine, DP rank and record number).
_STORED = f"""
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
    WHERE {IN_REFERENCE_GROUP}"""
# A block hash's figures from its events (in the reference group).
_USED = f"""
    SELECT
        block_hash,
        count(*) FILTER (WHERE kind = 'hit') AS hits,
        count(*) FILTER (WHERE kind = 'evict') AS evictions,
        min(block_position) FILTER (WHERE kind = 'hit') AS hit_position,
        min(ts_ns) FILTER (WHERE kind IN ('hit', 'store')) AS first_use_ns,
        max(ts_ns) FILTER (WHERE kind IN ('hit', 'store')) AS last_use_ns
    FROM events
    WHERE kind IN ('hit', 'store', 'evict') AND {IN_REFERENCE_GROUP}"""
_PREFIX_BLOCK = """
SELECT
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
FROM used
LEFT JOIN stored USING (block_hash)"""

WHOLE_PREFIX_BLOCKS = f"""
CREATE OR REPLACE TABLE prefix_blocks AS
WITH stored AS ({_STORED}
    GROUP BY block_hash
),
used AS ({_USED}
    GROUP BY block_hash
)
{_PREFIX_BLOCK}
ORDER BY used.hits DESC, block_position, used.block_hash
"""

# Carried: the hashes the rows from `$first_row` on or an open lifetime touch are figured
# again (their lifetimes whole, their events' counts added to the previous ones), and every
# other hash's row stands.
CARRIED_PREFIX_BLOCKS = f"""
CREATE OR REPLACE TABLE prefix_blocks AS
WITH new_used AS ({_USED} AND rowid >= $first_row
    GROUP BY block_hash
),
touched AS (
    SELECT block_hash FROM new_used
    UNION
    SELECT block_hash FROM previous_copy.cache_lifetimes
    WHERE ended_by IS NULL AND {IN_REFERENCE_GROUP}
),
stored AS ({_STORED} AND block_hash IN (SELECT block_hash FROM touched)
    GROUP BY block_hash
),
before AS (
    SELECT * FROM previous_copy.prefix_blocks
    WHERE block_hash IN (SELECT block_hash FROM touched)
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
{_PREFIX_BLOCK}
UNION ALL
SELECT * FROM previous_copy.prefix_blocks
ANTI JOIN touched USING (block_hash)
"""

# -- tenant_sharing -----------------------------------------------------------------------

# Block hits per time bucket and pair of tenants, of `temp.hit_stores`.
_SHARED_HITS = f"""
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

WHOLE_TENANT_SHARING = f"""
CREATE OR REPLACE TABLE tenant_sharing AS
{_SHARED_HITS}
ORDER BY ALL;

DROP TABLE temp.hit_stores
"""

# Carried: the new hits' counts added to the copy before's.
CARRIED_TENANT_SHARING = f"""
CREATE OR REPLACE TABLE tenant_sharing AS
SELECT * EXCLUDE (block_hits), CAST(sum(block_hits) AS BIGINT) AS block_hits
FROM ({_SHARED_HITS} UNION ALL SELECT * FROM previous_copy.tenant_sharing)
GROUP BY ALL
ORDER BY ALL;

DROP TABLE temp.hit_stores
"""
