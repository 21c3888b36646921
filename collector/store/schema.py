"""The DuckDB schema of one run file. Bump SCHEMA_VERSION whenever a table changes."""

from __future__ import annotations

from collector.store.lookup_causes import WHOLE_LOOKUP_CAUSES
from collector.store.rollups import ROLLUP_STATEMENTS
from engine_hooks.events import EVENT_KINDS

SCHEMA_VERSION = 10

_KINDS = ", ".join(f"'{kind}'" for kind in EVENT_KINDS)

# What vLLM's own KV events carry (collector/vllm_kv/ingest.py): batches as received, one
# row per block of each BlockStored / BlockRemoved (one per AllBlocksCleared), the batches
# that never arrived, and two different blocks seen under one published hash.
VLLM_KV_STATEMENTS = (
    "CREATE TYPE vllm_kv_event_kind AS ENUM ('stored', 'removed', 'cleared')",
    """CREATE TABLE vllm_kv_batches (
        endpoint VARCHAR NOT NULL,
        dp_rank SMALLINT,
        epoch INTEGER NOT NULL,
        seq UBIGINT NOT NULL,
        ts_ns BIGINT NOT NULL,
        num_events INTEGER NOT NULL,
        replayed BOOLEAN NOT NULL
    )""",
    """CREATE TABLE vllm_kv_events (
        dp_rank SMALLINT,
        epoch INTEGER NOT NULL,
        seq UBIGINT NOT NULL,
        event_index INTEGER NOT NULL,
        block_position INTEGER,
        ts_ns BIGINT NOT NULL,
        kind vllm_kv_event_kind NOT NULL,
        block_hash UBIGINT,
        block_hash_bytes BLOB,
        parent_hash UBIGINT,
        num_tokens INTEGER,
        lora_name VARCHAR,
        medium VARCHAR,
        group_idx INTEGER,
        num_extra_keys INTEGER
    )""",
    """CREATE TABLE vllm_kv_gaps (
        endpoint VARCHAR NOT NULL,
        dp_rank SMALLINT,
        epoch INTEGER NOT NULL,
        first_seq UBIGINT NOT NULL,
        last_seq UBIGINT NOT NULL,
        num_batches UBIGINT NOT NULL,
        reason VARCHAR NOT NULL,
        detected_ns BIGINT NOT NULL
    )""",
    """CREATE TABLE vllm_kv_conflicts (
        block_hash UBIGINT NOT NULL,
        block_hash_bytes BLOB,
        group_idx INTEGER,
        differs VARCHAR[] NOT NULL,
        first_dp_rank SMALLINT,
        first_epoch INTEGER NOT NULL,
        first_seq UBIGINT NOT NULL,
        first_ts_ns BIGINT NOT NULL,
        first_parent_hash UBIGINT,
        first_num_tokens INTEGER NOT NULL,
        first_lora_name VARCHAR,
        first_tokens_digest BLOB NOT NULL,
        first_token_ids BIGINT[],
        second_dp_rank SMALLINT,
        second_epoch INTEGER NOT NULL,
        second_seq UBIGINT NOT NULL,
        second_ts_ns BIGINT NOT NULL,
        second_parent_hash UBIGINT,
        second_num_tokens INTEGER NOT NULL,
        second_lora_name VARCHAR,
        second_tokens_digest BLOB NOT NULL,
        second_token_ids BIGINT[]
    )""",
)

CREATE_STATEMENTS = (
    "CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)",
    f"CREATE TYPE event_kind AS ENUM ({_KINDS})",
    """CREATE TABLE runs (
        run_id VARCHAR NOT NULL,
        source VARCHAR NOT NULL,
        trace VARCHAR,
        timing VARCHAR,
        block_size INTEGER NOT NULL,
        num_blocks INTEGER NOT NULL,
        hash_algo VARCHAR NOT NULL,
        max_num_seqs INTEGER,
        vllm_version VARCHAR NOT NULL,
        kvscope_version VARCHAR NOT NULL,
        started_at TIMESTAMP NOT NULL,
        options JSON,
        vllm_prefix_cache_queries BIGINT,
        vllm_prefix_cache_hits BIGINT,
        finished_at TIMESTAMP
    )""",
    """CREATE TABLE events (
        seq UBIGINT NOT NULL,
        pos INTEGER NOT NULL,
        ts_ns BIGINT NOT NULL,
        kind event_kind NOT NULL,
        request_id VARCHAR,
        block_id INTEGER,
        block_position INTEGER,
        block_hash UBIGINT,
        parent_hash UBIGINT,
        num_tokens INTEGER,
        num_prompt_tokens INTEGER,
        num_hit_tokens INTEGER,
        num_hit_blocks INTEGER,
        longest_group_hit_tokens INTEGER,
        num_tier_hit_tokens INTEGER,
        preempted BOOLEAN,
        age_ns BIGINT,
        num_hits INTEGER,
        ref_cnt INTEGER,
        num_output_tokens INTEGER,
        num_lost BIGINT,
        num_cleared INTEGER,
        extra_keys VARCHAR[],
        salt_hash VARCHAR,
        tenant VARCHAR,
        lora VARCHAR,
        engine_id VARCHAR,
        dp_rank SMALLINT,
        kv_group SMALLINT,
        token_fingerprint UBIGINT
    )""",
    """CREATE TABLE pool (
        seq UBIGINT NOT NULL,
        ts_ns BIGINT NOT NULL,
        num_free INTEGER NOT NULL,
        num_cached_free INTEGER NOT NULL,
        num_in_use INTEGER NOT NULL,
        engine_id VARCHAR,
        dp_rank SMALLINT,
        num_in_use_by_group INTEGER[]
    )""",
    """CREATE TABLE collisions (
        seq UBIGINT NOT NULL,
        ts_ns BIGINT NOT NULL,
        request_id VARCHAR,
        stored_by VARCHAR,
        block_id INTEGER NOT NULL,
        block_hash UBIGINT NOT NULL,
        stored_fingerprint BLOB NOT NULL,
        request_fingerprint BLOB NOT NULL,
        engine_id VARCHAR,
        dp_rank SMALLINT
    )""",
    "CREATE TABLE request_tokens (request_id VARCHAR NOT NULL, token_ids INTEGER[] NOT NULL)",
    "CREATE TABLE block_tokens (block_hash UBIGINT NOT NULL, token_ids INTEGER[] NOT NULL)",
    *VLLM_KV_STATEMENTS,
)

# The tables derived whole from the events by `finalize` (and by live refreshes, spaced by
# their cost), in this order. The eviction ages are derived as rows arrive: eviction_ages.py.
DERIVED_STATEMENTS = (
    """CREATE OR REPLACE TABLE requests AS
    SELECT
        request_id,
        min(ts_ns) FILTER (WHERE kind = 'arrive') AS arrival_ns,
        min(ts_ns) FILTER (WHERE kind = 'schedule') AS first_scheduled_ns,
        min(ts_ns) FILTER (WHERE kind = 'first_token') AS first_token_ns,
        max(ts_ns) FILTER (WHERE kind = 'finish') AS finished_ns,
        -- since the arrival at vLLM's front end where the hooks knew it (a live capture)
        arg_min(age_ns, seq) FILTER (WHERE kind = 'first_token') AS first_token_age_ns,
        arg_min(num_tokens, seq) FILTER (WHERE kind = 'first_token') AS num_prefill_tokens,
        count(*) FILTER (WHERE kind = 'preempt') AS num_preemptions,
        any_value(num_prompt_tokens) FILTER (WHERE kind = 'arrive') AS num_prompt_tokens,
        arg_min(num_hit_tokens, seq) FILTER (WHERE kind = 'lookup') AS num_hit_tokens,
        arg_min(num_hit_blocks, seq) FILTER (WHERE kind = 'lookup') AS num_hit_blocks,
        arg_min(longest_group_hit_tokens, seq) FILTER (WHERE kind = 'lookup')
            AS longest_group_hit_tokens,
        arg_min(num_tier_hit_tokens, seq) FILTER (WHERE kind = 'lookup') AS num_tier_hit_tokens,
        any_value(num_output_tokens) FILTER (WHERE kind = 'finish') AS num_output_tokens,
        any_value(tenant) FILTER (WHERE kind = 'arrive') AS tenant,
        any_value(lora) FILTER (WHERE kind = 'arrive') AS lora,
        any_value(salt_hash) FILTER (WHERE kind = 'arrive') AS salt_hash
    FROM events
    WHERE kind IN ('arrive', 'lookup', 'schedule', 'preempt', 'first_token', 'finish')
        AND request_id IS NOT NULL
    GROUP BY request_id""",
    *ROLLUP_STATEMENTS,
    WHOLE_LOOKUP_CAUSES,
)
