"""The derived table `lookup_causes`: one row per lookup and cause, every prompt token of
every lookup given one cause (collector/queries/miss_causes.py defines them and reads it).
Built from every event row (`WHOLE_LOOKUP_CAUSES`), or carried over by a live copy
(`CARRIED_LOOKUP_CAUSES`, collector/store/copy_carry.py).

The SQL: each lookup's segments and missed full blocks; each block's state at the lookup on
its engine and on the others; the cause each run of new blocks opens with; each block's
cause; per lookup and cause, its tokens and the details of its first block.

A lookup's causes are final once its request has finished: they read the events before the
lookup (on its engine, or timed before it on the others), and the request's own records
(the hashes it stored), which end with it. Whether a key mismatch can be told without token
ids turns on the keys its engine had seen before the lookup, not on later ones. So a live
copy keeps the rows of the requests that finished before its new rows, and were timed
before all of them, as they were, and derives the others again.
"""

from __future__ import annotations

from collector.store.reference_group import IN_REFERENCE_GROUP

# The `meta` key of an engine's stop, "engine_stopped ENGINE dpRANK" (collector/live/
# announced.py keeps it): a lifetime still open on an engine when it stopped ends there.
ENGINE_STOP_KEY = "engine_stopped"

# Each lookup, where it starts in its engine's records (`cut`: the first record of its
# admission, the hits, allocations, evictions and stores it made, which come before the
# lookup's own record), its segments' bounds in tokens and its missed blocks' positions.
_LOOKUPS = """
lookup_rows AS (
    SELECT seq, ts_ns, request_id, coalesce(engine_id, '') AS engine,
        coalesce(dp_rank, 0) AS rank, preempted, num_prompt_tokens AS prompt,
        num_hit_tokens AS hit, coalesce(num_tier_hit_tokens, 0) AS tier,
        greatest(coalesce(longest_group_hit_tokens, 0) - num_hit_tokens
            - coalesce(num_tier_hit_tokens, 0), 0) AS group_cut
    FROM events
    WHERE kind = 'lookup' AND {lookups_of}
),
own_rows AS (
    SELECT seq, request_id, coalesce(engine_id, '') AS engine, coalesce(dp_rank, 0) AS rank,
        kind IN ('hit', 'allocate', 'store', 'evict') AS admitting
    FROM events
    WHERE request_id IN (SELECT request_id FROM lookup_rows)
),
lookups AS (
    SELECT lookup_rows.*, min(own_rows.seq) AS cut
    FROM lookup_rows
    ASOF LEFT JOIN (SELECT * FROM own_rows WHERE NOT admitting) AS before
        ON before.request_id = lookup_rows.request_id AND before.engine = lookup_rows.engine
        AND before.rank = lookup_rows.rank AND before.seq < lookup_rows.seq
    LEFT JOIN own_rows
        ON own_rows.request_id = lookup_rows.request_id AND own_rows.engine = lookup_rows.engine
        AND own_rows.rank = lookup_rows.rank AND own_rows.admitting
        AND own_rows.seq > coalesce(before.seq, -1) AND own_rows.seq < lookup_rows.seq
    GROUP BY ALL
),
bounds AS (
    SELECT lookups.* REPLACE (coalesce(cut, seq) AS cut), runs.block_size AS bs,
        hit + tier + group_cut AS miss_start,
        (hit + tier + group_cut + bs - 1) // bs AS first_block,
        greatest(prompt - 1, 0) // bs AS end_block,
        greatest(end_block * bs, miss_start) AS tail_start,
        greatest(least(first_block * bs, tail_start) - miss_start, 0) AS unaligned
    FROM lookups, runs
)"""
# Each missed full block with the hash the request holds there and its own state.
_BLOCK_STATES = f"""
request_blocks AS (
    SELECT coalesce(engine_id, '') AS engine, coalesce(dp_rank, 0) AS rank, request_id,
        block_position AS position, any_value(block_hash) AS block_hash,
        any_value(token_fingerprint) FILTER (WHERE kind = 'store') AS token_fp
    FROM events
    WHERE kind IN ('store', 'hit') AND {IN_REFERENCE_GROUP}
        AND request_id IN (SELECT request_id FROM lookups)
    GROUP BY ALL
),
missed AS (
    SELECT seq, cut, ts_ns, request_id, engine, rank, preempted, bs,
        unnest(range(first_block, end_block)) AS position
    FROM bounds
),
-- Each engine's stop (the collector keeps it in `meta`: collector/live/announced.py).
stops AS (
    SELECT value->>'engine_id' AS engine, CAST(value->>'dp_rank' AS INTEGER) AS rank,
        CAST(value->>'seq' AS UBIGINT) AS stop_seq,
        CAST(value->>'stopped_ns' AS BIGINT) AS stopped_ns
    FROM meta WHERE starts_with(key, '{ENGINE_STOP_KEY} ')
),
-- The reference group's lifetimes (lifetime_rollups.py), with the request whose
-- allocation evicted each block that was evicted; a lifetime still open when its engine
-- stopped ends there ('stop').
lifetimes AS (
    SELECT lifetimes.engine, lifetimes.rank, lifetimes.store_seq, lifetimes.stored_ns,
        lifetimes.block_hash, lifetimes.stored_by,
        coalesce(lifetimes.ended_by, CASE WHEN stops.stop_seq IS NOT NULL THEN 'stop' END)
            AS ended_by,
        coalesce(lifetimes.ended_seq, stops.stop_seq) AS ended_seq,
        CASE WHEN lifetimes.ended_by IS NOT NULL THEN lifetimes.ended_ns ELSE stops.stopped_ns
        END AS ended_ns,
        evictions.request_id AS evicted_by
    FROM cache_lifetimes AS lifetimes
    LEFT JOIN stops ON stops.engine = lifetimes.engine AND stops.rank = lifetimes.rank
    LEFT JOIN (
        SELECT DISTINCT seq, block_id, request_id, coalesce(engine_id, '') AS engine,
            coalesce(dp_rank, 0) AS rank
        FROM events WHERE kind = 'evict'
    ) AS evictions
        ON lifetimes.ended_by = 'evict' AND evictions.engine = lifetimes.engine
        AND evictions.rank = lifetimes.rank AND evictions.seq = lifetimes.ended_seq
        AND evictions.block_id = lifetimes.block_id
    WHERE lifetimes.kv_group = (SELECT kv_group FROM reference_group)
),
here AS (
    SELECT missed.*, request_blocks.block_hash, request_blocks.token_fp,
        parents.block_hash AS parent_hash,
        lifetimes.store_seq IS NOT NULL AS stored_here,
        lifetimes.store_seq IS NOT NULL
            AND (lifetimes.ended_seq IS NULL OR lifetimes.ended_seq >= missed.cut) AS cached_here,
        lifetimes.ended_by, lifetimes.ended_ns, lifetimes.evicted_by,
        lifetimes.stored_by = missed.request_id AS own_store
    FROM missed
    LEFT JOIN request_blocks USING (engine, rank, request_id, position)
    LEFT JOIN request_blocks AS parents
        ON parents.request_id = missed.request_id AND parents.engine = missed.engine
        AND parents.rank = missed.rank AND parents.position = missed.position - 1
    ASOF LEFT JOIN lifetimes
        ON lifetimes.engine = missed.engine AND lifetimes.rank = missed.rank
        AND lifetimes.block_hash = request_blocks.block_hash
        AND lifetimes.store_seq < missed.cut
),
"""
# ... and its state elsewhere, on the other engines of a fleet (no f-string: struct braces).
_ELSEWHERE = """
elsewhere AS (
    SELECT here.seq, here.engine, here.rank, here.position,
        arg_min(lifetimes.engine, lifetimes.stored_ns) FILTER (
            WHERE lifetimes.ended_ns IS NULL OR lifetimes.ended_ns > here.ts_ns
        ) AS cached_on,
        arg_max({'engine': lifetimes.engine, 'ended_by': lifetimes.ended_by,
            'evicted_by': lifetimes.evicted_by, 'ended_ns': lifetimes.ended_ns},
            lifetimes.ended_ns) FILTER (WHERE lifetimes.ended_ns <= here.ts_ns) AS ended_on
    FROM here
    JOIN lifetimes
        ON lifetimes.block_hash = here.block_hash AND lifetimes.stored_ns < here.ts_ns
        AND (lifetimes.engine <> here.engine OR lifetimes.rank <> here.rank)
    WHERE NOT here.cached_here
    GROUP BY ALL
),
states AS (
    SELECT here.*, elsewhere.cached_on,
        CASE
            WHEN here.block_hash IS NULL THEN 'never_stored'
            WHEN cached_here THEN 'cached'
            WHEN cached_on IS NOT NULL THEN 'other_engine'
            WHEN stored_here AND ended_by = 'reset' THEN 'cleared'
            WHEN stored_here AND own_store AND here.preempted THEN 'preempted'
            WHEN stored_here THEN 'evicted'
            WHEN ended_on IS NULL THEN 'new'
            WHEN ended_on.ended_by = 'reset' THEN 'cleared'
            WHEN ended_on.ended_by = 'stop' THEN 'engine_stopped'
            ELSE 'evicted'
        END AS state,
        CASE WHEN NOT stored_here THEN ended_on.engine END AS ended_engine,
        CASE WHEN stored_here THEN here.evicted_by ELSE ended_on.evicted_by END AS evictor,
        CASE WHEN stored_here THEN here.ended_ns ELSE ended_on.ended_ns END AS gone_ns
    FROM here
    LEFT JOIN elsewhere USING (seq, engine, rank, position)
),
"""
# Each run of new blocks opens with a key mismatch, a divergence or a cold block.
_NEW_BLOCKS = f"""
sequenced AS (
    SELECT states.*,
        lag(state) OVER (PARTITION BY engine, rank, seq ORDER BY position) AS previous_state
    FROM states
),
openings AS (
    SELECT seq, cut, engine, rank, position, request_id, ts_ns, parent_hash, token_fp, bs
    FROM sequenced
    WHERE state = 'new' AND previous_state IS DISTINCT FROM 'new'
),
placed_stores AS (
    SELECT seq, ts_ns, parent_hash, block_position, request_id, token_fingerprint,
        coalesce(engine_id, '') AS engine, coalesce(dp_rank, 0) AS rank
    FROM events
    WHERE kind = 'store' AND {IN_REFERENCE_GROUP}
),
keyed AS (  -- where each engine first met an extra key (a salt, an adapter, another key)
    SELECT coalesce(engine_id, '') AS engine, coalesce(dp_rank, 0) AS rank,
        min(seq) AS first_key_seq
    FROM events
    WHERE (kind = 'arrive' AND (salt_hash IS NOT NULL OR lora IS NOT NULL))
        OR (kind = 'store' AND len(extra_keys) > 0)
    GROUP BY ALL
),
-- Another request's block after the same parent, cached before the lookup (by record number
-- on its engine, by time elsewhere): the prompt diverged inside this block.
divergences AS (
    SELECT DISTINCT openings.seq, openings.engine, openings.rank, openings.position
    FROM openings
    JOIN placed_stores AS theirs
        ON theirs.parent_hash = openings.parent_hash AND theirs.block_position = openings.position
        AND CASE
            WHEN theirs.engine = openings.engine AND theirs.rank = openings.rank
                THEN theirs.seq < openings.cut
            ELSE theirs.ts_ns < openings.ts_ns
        END
),
-- A block of the same engine cached before the lookup with the same tokens (the same
-- key-free fingerprint, or, without one, the same recorded prompt up to it): another key.
fingerprinted AS (
    SELECT openings.seq, openings.engine, openings.rank, openings.position,
        openings.request_id, theirs.request_id AS their_request, theirs.ts_ns AS their_ns
    FROM openings
    JOIN placed_stores AS theirs
        ON theirs.token_fingerprint = openings.token_fp AND theirs.engine = openings.engine
        AND theirs.rank = openings.rank AND theirs.seq < openings.cut
),
token_openings AS (
    SELECT openings.*,
        hash(list_slice(tokens.token_ids, 1, (openings.position + 1) * openings.bs)) AS prefix
    FROM openings
    JOIN keyed USING (engine, rank)
    JOIN request_tokens AS tokens USING (request_id)
    WHERE openings.token_fp IS NULL AND keyed.first_key_seq <= openings.seq
),
token_candidates AS (
    SELECT theirs.*,
        hash(list_slice(tokens.token_ids, 1, (theirs.block_position + 1) * runs.block_size))
            AS prefix
    FROM placed_stores AS theirs
    JOIN request_tokens AS tokens USING (request_id)
    CROSS JOIN runs
    WHERE (theirs.engine, theirs.rank, theirs.block_position) IN (
        SELECT (engine, rank, position) FROM token_openings)
),
same_tokens AS (
    SELECT * FROM fingerprinted
    UNION ALL
    SELECT openings.seq, openings.engine, openings.rank, openings.position,
        openings.request_id, theirs.request_id, theirs.ts_ns
    FROM token_openings AS openings
    JOIN token_candidates AS theirs
        ON theirs.prefix = openings.prefix AND theirs.engine = openings.engine
        AND theirs.rank = openings.rank AND theirs.block_position = openings.position
        AND theirs.seq < openings.cut
),
mismatches AS (
    SELECT same.seq, same.engine, same.rank, same.position,
        arg_min(CASE
            WHEN mine.salt_hash IS DISTINCT FROM theirs.salt_hash THEN 'cache_salt'
            WHEN mine.lora IS DISTINCT FROM theirs.lora THEN 'lora'
            ELSE 'extra_keys'
        END, same.their_ns) AS key_kind
    FROM same_tokens AS same
    LEFT JOIN requests AS mine ON mine.request_id = same.request_id
    LEFT JOIN requests AS theirs ON theirs.request_id = same.their_request
    GROUP BY ALL
),
classified AS (
    SELECT sequenced.*, mismatches.key_kind,
        coalesce(keyed.first_key_seq <= seq, false) AND recorded.request_id IS NULL
            AND token_fp IS NULL AS keys_unseen,
        CASE
            WHEN state = 'never_stored' THEN 'unexplained'
            WHEN state = 'cached' OR (state = 'new' AND previous_state = 'new') THEN NULL
            WHEN state <> 'new' THEN state
            WHEN mismatches.key_kind IS NOT NULL THEN 'key_mismatch'
            WHEN keys_unseen THEN 'unexplained'
            WHEN divergences.seq IS NOT NULL THEN 'diverged'
            ELSE 'cold'
        END AS own_cause,
        CASE
            WHEN state = 'never_stored' THEN 'never_stored'
            WHEN own_cause = 'unexplained' THEN 'no_token_ids'
        END AS own_reason,
        max(CASE WHEN own_cause IS NOT NULL THEN position END) OVER (
            PARTITION BY engine, rank, seq ORDER BY position
            ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW
        ) AS source_position
    FROM sequenced
    LEFT JOIN keyed USING (engine, rank)
    LEFT JOIN (SELECT DISTINCT request_id FROM request_tokens) AS recorded USING (request_id)
    LEFT JOIN mismatches USING (seq, engine, rank, position)
    LEFT JOIN divergences USING (seq, engine, rank, position)
),
"""
# Each missed full block with its cause (its own, or the block's it follows).
_BLOCKS = """
blocks AS (
    SELECT block.seq, block.engine, block.rank, block.request_id, block.ts_ns,
        block.preempted, block.position, block.bs, block.state,
        coalesce(source.own_cause, 'unexplained') AS cause,
        CASE WHEN source.own_cause IS NULL THEN 'cached_at_lookup' ELSE source.own_reason END
            AS reason,
        source.key_kind, source.cached_on AS other_engine, source.ended_engine AS evicted_on,
        source.evictor AS evicted_by, block.ts_ns - source.gone_ns AS evicted_ago_ns
    FROM classified AS block
    LEFT JOIN classified AS source
        ON source.seq = block.seq AND source.engine = block.engine
        AND source.rank = block.rank AND source.position = block.source_position
),
"""
_SEGMENTS = f"""
segments AS (
    SELECT seq, engine, rank, request_id, ts_ns, preempted, cause, reason, tokens,
        tokens // bs AS blocks, first_token // bs AS first_position, NULL AS key_kind,
        NULL AS other_engine, NULL AS evicted_on, NULL AS evicted_by, NULL AS evicted_ago_ns
    FROM bounds, LATERAL (VALUES
        ('hit', NULL, hit, 0),
        ('tier', NULL, tier, hit),
        ('group_cut', NULL, group_cut, hit + tier),
        ('unexplained', 'unaligned', unaligned, miss_start),
        ('partial_block', NULL, prompt - tail_start, tail_start)
    ) AS segment(cause, reason, tokens, first_token)
    WHERE tokens > 0
    UNION ALL
    SELECT seq, engine, rank, request_id, ts_ns, preempted, cause, arg_min(reason, position),
        count(*) * any_value(bs), count(*), min(position), arg_min(key_kind, position),
        arg_min(other_engine, position), arg_min(evicted_on, position),
        arg_min(evicted_by, position), arg_min(evicted_ago_ns, position)
    FROM blocks
    GROUP BY seq, engine, rank, request_id, ts_ns, preempted, cause
),
roots AS (
    SELECT request_id, any_value(block_hash) AS family
    FROM events
    WHERE kind IN ('hit', 'store') AND block_position = 0 AND {IN_REFERENCE_GROUP}
        AND (request_id IN (SELECT request_id FROM segments)
            OR request_id IN (SELECT evicted_by FROM segments))
    GROUP BY ALL
)
SELECT segments.*, roots.family, requests.tenant AS evicted_by_tenant,
    evictors.family AS evicted_by_family
FROM segments
LEFT JOIN roots USING (request_id)
LEFT JOIN requests ON requests.request_id = segments.evicted_by
LEFT JOIN roots AS evictors ON evictors.request_id = segments.evicted_by
"""
_WITH_BLOCKS = "WITH " + _LOOKUPS + ",\n" + _BLOCK_STATES + _ELSEWHERE + _NEW_BLOCKS + _BLOCKS
_LOOKUP_CAUSES = _WITH_BLOCKS + _SEGMENTS

# Every lookup's causes, from every event row.
WHOLE_LOOKUP_CAUSES = "CREATE OR REPLACE TABLE lookup_causes AS " + _LOOKUP_CAUSES.replace(
    "{lookups_of}", "true"
)
# The lookups the copy before (`previous_copy`) holds as they stand: of requests that
# finished on their engine before event row `$first_row`, and earlier than every new row
# (another engine's new records may be timed before the copy's last: a clock behind, or a
# late delivery).
_SETTLED = """({lookup}.ts_ns < (SELECT min(ts_ns) FROM events WHERE rowid >= $first_row)
    AND EXISTS (
        SELECT 1 FROM events AS finish
        WHERE finish.kind = 'finish' AND finish.rowid < $first_row
            AND finish.request_id = {lookup}.request_id
            AND coalesce(finish.engine_id, '') = {engine}
            AND coalesce(finish.dp_rank, 0) = {rank}
    ))"""
CARRIED_LOOKUP_CAUSES = (
    "CREATE OR REPLACE TABLE lookup_causes AS "
    + _LOOKUP_CAUSES.replace(
        "{lookups_of}",
        "NOT coalesce("
        + _SETTLED.format(
            lookup="events",
            engine="coalesce(events.engine_id, '')",
            rank="coalesce(events.dp_rank, 0)",
        )
        + ", false)",
    )
    + " UNION ALL SELECT * FROM previous_copy.lookup_causes AS kept WHERE "
    + _SETTLED.format(lookup="kept", engine="kept.engine", rank="kept.rank")
)
# One request's missed full blocks, one row each (`$request`).
REQUEST_BLOCKS = (
    _WITH_BLOCKS.replace("{lookups_of}", "request_id = $request").rstrip().removesuffix(",")
    + " SELECT * EXCLUDE (bs) FROM blocks ORDER BY engine, rank, seq, position"
)
