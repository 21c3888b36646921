"""The headline figures of one run, the same for `kvscope replay --json` and `kvscope summary`."""

from __future__ import annotations

from typing import TypedDict

from collector.queries.pool import free_block_extremes
from collector.store.run_file import RunFile

_SUMMARY_SQL = """
WITH lookups AS (
    SELECT
        count(*) AS requests,
        coalesce(sum(num_prompt_tokens), 0) AS prompt_tokens,
        coalesce(sum(num_hit_tokens), 0) AS hit_tokens,
        coalesce(sum(num_hit_blocks), 0) AS hit_blocks,
        coalesce(sum(num_tier_hit_tokens), 0) AS tier_hit_tokens,
        coalesce(sum((num_prompt_tokens + runs.block_size - 1) // runs.block_size), 0)
            AS prompt_blocks
    FROM events, runs
    WHERE kind = 'lookup' AND NOT preempted
),
counts AS (
    SELECT
        count(*) FILTER (WHERE kind = 'evict') AS evictions,
        count(*) FILTER (WHERE kind = 'store') AS stores,
        count(*) FILTER (WHERE kind = 'hit') AS block_hits,
        count(*) FILTER (WHERE kind = 'preempt') AS preemptions,
        count(*) FILTER (WHERE kind = 'reset') AS resets,
        coalesce(sum(num_lost) FILTER (WHERE kind = 'drop'), 0) AS dropped_events,
        count(*) AS event_rows
    FROM events
)
SELECT
    lookups.*,
    counts.*,
    (SELECT count(*) FROM pool) AS pool_rows,
    (SELECT count(*) FROM collisions) AS collisions,
    runs.block_size,
    runs.num_blocks,
    runs.hash_algo,
    runs.vllm_prefix_cache_queries,
    runs.vllm_prefix_cache_hits
FROM lookups, counts, runs
"""


class HeadlineFigures(TypedDict):
    """What a run did, over the whole run (`run_summary`) or a window (`window_figures`)."""

    requests: int
    token_hit_ratio: float
    block_hit_ratio: float
    evictions: int
    events: int
    prompt_tokens: int
    hit_tokens: int
    prompt_blocks: int
    hit_blocks: int
    stores: int
    block_hits: int
    preemptions: int
    resets: int
    collisions: int
    dropped_events: int


class RunSummary(HeadlineFigures):
    """The headline figures of a run, its pool pressure and its cache settings (what
    `kvscope summary --json` prints)."""

    min_free_blocks: int
    min_free_share: float
    low_free_s: float
    low_free_time_share: float
    block_size: int
    num_blocks: int
    hash_algo: str
    vllm_prefix_cache_queries: int | None
    vllm_prefix_cache_hits: int | None
    tier_hit_tokens: int
    tier_token_hit_ratio: float
    capture_stopped: str


def hit_ratio(hits: int, looked_up: int) -> float:
    """Hits / what was looked up, 0 when nothing was."""
    return hits / looked_up if looked_up else 0.0


def run_summary(run: RunFile) -> RunSummary:
    """Requests, hit ratios (tokens and blocks), evictions and record counts of a run.

    token_hit_ratio is vLLM's PrefixCacheStats ratio: hit tokens / looked-up tokens over
    requests admitted for the first time. block_hit_ratio is hit blocks / prompt blocks, a
    prompt having ceil(tokens / block size) blocks (the partial last block counts).
    Pool pressure: the fewest free blocks and their share of the usable pool; the time
    spent under 10 % of it free (`pool.LOW_FREE_FRACTION`) and its share of the time the
    pool steps cover. Tier hits: prompt tokens an offload tier (a KV connector) supplied
    beyond the GPU hit, and their share of the looked-up tokens (0 without a tier).
    """
    figures = run.record(_SUMMARY_SQL)
    assert figures is not None
    pool = free_block_extremes(run)
    usable = pool["usable_blocks"]
    prompt_tokens = figures["prompt_tokens"]
    prompt_blocks = figures["prompt_blocks"]
    return {
        "requests": figures["requests"],
        "token_hit_ratio": hit_ratio(figures["hit_tokens"], prompt_tokens),
        "block_hit_ratio": hit_ratio(figures["hit_blocks"], prompt_blocks),
        "evictions": figures["evictions"],
        "events": figures["event_rows"] + figures["pool_rows"] + figures["collisions"],
        "prompt_tokens": prompt_tokens,
        "hit_tokens": figures["hit_tokens"],
        "prompt_blocks": prompt_blocks,
        "hit_blocks": figures["hit_blocks"],
        "stores": figures["stores"],
        "block_hits": figures["block_hits"],
        "preemptions": figures["preemptions"],
        "resets": figures["resets"],
        "collisions": figures["collisions"],
        "dropped_events": figures["dropped_events"],
        "min_free_blocks": pool["min_free_blocks"],
        "min_free_share": pool["min_free_blocks"] / usable if usable else 0.0,
        "low_free_s": pool["low_free_s"],
        "low_free_time_share": pool["low_free_time_share"],
        "block_size": figures["block_size"],
        "num_blocks": figures["num_blocks"],
        "hash_algo": figures["hash_algo"],
        "vllm_prefix_cache_queries": figures["vllm_prefix_cache_queries"],
        "vllm_prefix_cache_hits": figures["vllm_prefix_cache_hits"],
        "tier_hit_tokens": figures["tier_hit_tokens"],
        "tier_token_hit_ratio": hit_ratio(figures["tier_hit_tokens"], prompt_tokens),
        "capture_stopped": capture_stops(run),
    }


def capture_stops(run: RunFile) -> str:
    """The engines whose hooks stopped capturing during the run, and why ("" if none): what
    the run misses of them after that point was never recorded."""
    rows = run.rows(
        "SELECT substr(key, 17), value FROM meta WHERE starts_with(key, 'capture_stopped ') "
        "ORDER BY key"
    )
    return "; ".join(f"{engine}: {reason}" for engine, reason in rows)
