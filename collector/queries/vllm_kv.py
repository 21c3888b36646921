"""Named queries over what a run got from vLLM's own KV events (the vllm_kv_* tables).

Times are seconds since the run's first vLLM batch (`t_s`), on the engine's wall clock.
A medium is where a block is held: "GPU" (the prefix cache's pool; older vLLMs send no
medium, which means it) or an offload tier of vLLM's offloading connector ("CPU", "STORAGE").
"""

from __future__ import annotations

from datetime import UTC, datetime

import pandas as pd

from collector.store.run_file import RunFile

# Per event that changes whether a block is held: its time, medium and change (+1 / -1).
# A block is one (DP rank, KV cache group, hash). vLLM's offloading connector announces a hash
# again for each offloaded chunk that contains it, and the GPU pool for each block cached under
# it, so a block is held while its stores outnumber its removals; a removal of a block never
# seen stored (before the collector started, or in lost batches) counts for nothing. An
# AllBlocksCleared ends every GPU block of its rank, not the offload tiers' (vLLM's connector
# keeps them); an engine restart (a new epoch of the rank) ends them all.
_HELD_CHANGES = """
WITH ordered AS (
    SELECT
        ts_ns, dp_rank, epoch, seq, event_index, block_position, kind, group_idx,
        block_hash, block_hash_bytes,
        coalesce(medium, 'GPU') AS medium,
        sum((kind = 'cleared')::INTEGER) OVER (
            PARTITION BY dp_rank, epoch ORDER BY seq, event_index, block_position
            ROWS UNBOUNDED PRECEDING
        ) AS clears
    FROM vllm_kv_events
),
counted AS (
    SELECT
        *,
        sum(CASE kind WHEN 'stored' THEN 1 ELSE -1 END) OVER (
            PARTITION BY dp_rank, epoch, life, medium, group_idx, block_hash, block_hash_bytes
            ORDER BY seq, event_index, block_position ROWS UNBOUNDED PRECEDING
        ) AS running
    FROM (
        SELECT * EXCLUDE (clears), CASE WHEN medium = 'GPU' THEN clears ELSE 0 END AS life
        FROM ordered
        WHERE kind <> 'cleared'
    )
),
held AS (
    -- Whether the block is held after this event and was before it: the running count,
    -- never below zero (removals beyond the stores seen are ignored), is above zero.
    SELECT
        ts_ns, dp_rank, epoch, life, medium,
        running - least(0, min(running) OVER up_to_here) > 0 AS is_held,
        coalesce(lag(running) OVER block_events, 0)
            - least(0, coalesce(min(running) OVER before_here, 0)) > 0 AS was_held,
        lead(running) OVER block_events IS NULL AS is_last
    FROM counted
    WINDOW
        block_events AS (
            PARTITION BY dp_rank, epoch, life, medium, group_idx, block_hash, block_hash_bytes
            ORDER BY seq, event_index, block_position
        ),
        up_to_here AS (
            PARTITION BY dp_rank, epoch, life, medium, group_idx, block_hash, block_hash_bytes
            ORDER BY seq, event_index, block_position ROWS UNBOUNDED PRECEDING
        ),
        before_here AS (
            PARTITION BY dp_rank, epoch, life, medium, group_idx, block_hash, block_hash_bytes
            ORDER BY seq, event_index, block_position
            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
        )
),
clear_ends AS (  -- the n-th AllBlocksCleared of a rank's epoch ends its GPU life n - 1
    SELECT dp_rank, epoch, clears - 1 AS life, ts_ns AS end_ns
    FROM ordered
    WHERE kind = 'cleared'
),
epoch_ends AS (  -- a rank's next epoch (its engine restarted) ends every life of this one
    SELECT
        dp_rank,
        epoch,
        lead(min(ts_ns)) OVER (PARTITION BY dp_rank ORDER BY epoch) AS end_ns
    FROM vllm_kv_events
    GROUP BY dp_rank, epoch
),
ended AS (  -- blocks still held when their life ended
    SELECT coalesce(clear_ends.end_ns, epoch_ends.end_ns) AS ts_ns, held.medium, -1 AS change
    FROM held
    LEFT JOIN clear_ends
        ON held.medium = 'GPU'
        AND clear_ends.dp_rank IS NOT DISTINCT FROM held.dp_rank
        AND clear_ends.epoch = held.epoch
        AND clear_ends.life = held.life
    LEFT JOIN epoch_ends
        ON epoch_ends.dp_rank IS NOT DISTINCT FROM held.dp_rank
        AND epoch_ends.epoch = held.epoch
    WHERE held.is_last AND held.is_held
        AND coalesce(clear_ends.end_ns, epoch_ends.end_ns) IS NOT NULL
),
held_changes AS (
    SELECT ts_ns, medium, is_held::INTEGER - was_held::INTEGER AS change
    FROM held
    WHERE is_held <> was_held
    UNION ALL
    SELECT ts_ns, medium, change FROM ended
)
"""


def vllm_kv_summary(run: RunFile) -> dict[str, int]:
    """Batches (and how many came from vLLM's replay buffer), blocks stored and removed,
    caches cleared, batches lost, hash conflicts, and what kind of hashes vLLM sent."""
    row = run.record(
        """
        SELECT
            (SELECT count(*) FROM vllm_kv_batches) AS batches,
            (SELECT count(*) FILTER (WHERE replayed) FROM vllm_kv_batches) AS replayed_batches,
            (SELECT count(DISTINCT (endpoint, epoch)) - count(DISTINCT endpoint)
                FROM vllm_kv_batches) AS publisher_restarts,
            count(*) FILTER (WHERE kind = 'stored') AS stored_blocks,
            count(*) FILTER (WHERE kind = 'removed') AS removed_blocks,
            count(*) FILTER (WHERE kind = 'cleared') AS clears,
            count(DISTINCT block_hash) FILTER (WHERE kind = 'stored') AS distinct_stored_hashes,
            count(*) FILTER (WHERE block_hash_bytes IS NOT NULL) AS full_hash_blocks,
            count(DISTINCT dp_rank) AS dp_ranks,
            (SELECT coalesce(sum(num_batches), 0) FROM vllm_kv_gaps) AS lost_batches,
            (SELECT count(*) FROM vllm_kv_gaps) AS gaps,
            (SELECT count(*) FROM vllm_kv_conflicts) AS conflicts
        FROM vllm_kv_events
        """
    )
    assert row is not None
    return {name: int(value) for name, value in row.items()}


def vllm_kv_media(run: RunFile) -> pd.DataFrame:
    """Per medium, GPU first: blocks stored and blocks removed (what each held over time, and
    at the end, is `vllm_kv_tier_occupancy`)."""
    return run.frame(
        """
        SELECT
            medium,
            count(*) FILTER (WHERE kind = 'stored') AS stored_blocks,
            count(*) FILTER (WHERE kind = 'removed') AS removed_blocks
        FROM (
            SELECT coalesce(medium, 'GPU') AS medium, kind
            FROM vllm_kv_events
            WHERE kind <> 'cleared'
        )
        GROUP BY medium
        ORDER BY medium <> 'GPU', medium
        """
    )


def vllm_kv_activity(
    run: RunFile, num_buckets: int = 60, medium: str | None = None
) -> pd.DataFrame:
    """Per time bucket: blocks stored, blocks removed, and whole-cache clears; of one medium
    only when `medium` is given (clears are the GPU pool's). Every medium's buckets line up."""
    grid = _buckets(run, num_buckets)
    return run.frame(
        """
        SELECT
            (ts_ns - $start) // $bucket * $bucket / 1e9 AS t_s,
            count(*) FILTER (WHERE kind = 'stored') AS stored,
            count(*) FILTER (WHERE kind = 'removed') AS removed,
            count(*) FILTER (WHERE kind = 'cleared') AS cleared
        FROM vllm_kv_events
        WHERE CAST($medium AS VARCHAR) IS NULL OR coalesce(medium, 'GPU') = $medium
        GROUP BY ALL
        ORDER BY t_s
        """,
        {"start": grid["start"], "bucket": grid["bucket"], "medium": medium},
    )


def vllm_kv_tier_occupancy(run: RunFile, num_buckets: int = 60) -> pd.DataFrame:
    """Per time bucket and medium (GPU first): the blocks held at the bucket's end. One row
    for every bucket and medium, so a medium's line runs the whole run, and its last row is
    what the medium held at the end."""
    grid = _buckets(run, num_buckets)
    return run.frame(
        f"""
        {_HELD_CHANGES},
        per_bucket AS (
            SELECT (ts_ns - $start) // $bucket AS bucket, medium, sum(change) AS change
            FROM held_changes
            GROUP BY ALL
        ),
        media AS (SELECT DISTINCT medium FROM ordered WHERE kind <> 'cleared')
        SELECT
            bucket * $bucket / 1e9 AS t_s,
            medium,
            sum(coalesce(change, 0)) OVER (PARTITION BY medium ORDER BY bucket)::BIGINT
                AS blocks_held
        FROM (SELECT range AS bucket FROM range(0, ($end - $start) // $bucket + 1))
        CROSS JOIN media
        LEFT JOIN per_bucket USING (bucket, medium)
        ORDER BY medium <> 'GPU', medium, t_s
        """,
        grid,
    )


def batch_times(run: RunFile) -> tuple[datetime, datetime] | None:
    """The wall times (UTC, naive) of the run's first vLLM batch, where its `t_s` count from,
    and its last (vLLM stamps a batch with the engine's wall clock); None without one."""
    row = run.row("SELECT min(ts_ns), max(ts_ns) FROM vllm_kv_events")
    if row is None or row[0] is None:
        return None
    first, last = (datetime.fromtimestamp(int(ns) / 1e9, UTC).replace(tzinfo=None) for ns in row)
    return first, last


def _buckets(run: RunFile, num_buckets: int) -> dict[str, int]:
    """The time grid every chart of these events shares: the first and last event (ns) and
    the width of a bucket."""
    row = run.row("SELECT min(ts_ns), max(ts_ns) FROM vllm_kv_events")
    start_ns, end_ns = (0, 0) if row is None or row[0] is None else (int(row[0]), int(row[1]))
    return {"start": start_ns, "end": end_ns, "bucket": max((end_ns - start_ns) // num_buckets, 1)}


def vllm_kv_gaps(run: RunFile) -> pd.DataFrame:
    """Every run of batches that never arrived: which stream, which numbers, why."""
    return run.frame(
        """
        SELECT endpoint, dp_rank, epoch, first_seq, last_seq, num_batches, reason
        FROM vllm_kv_gaps
        ORDER BY endpoint, epoch, first_seq
        """
    )


def vllm_kv_conflicts(run: RunFile) -> pd.DataFrame:
    """Every hash conflict, hashes in hex, the two blocks' descriptions side by side."""
    return run.frame(
        """
        SELECT
            printf('%016x', block_hash) AS block_hash,
            group_idx,
            array_to_string(differs, ', ') AS differs,
            first_seq,
            printf('%016x', first_parent_hash) AS first_parent_hash,
            first_num_tokens,
            first_lora_name,
            lower(hex(first_tokens_digest)) AS first_tokens_digest,
            first_token_ids,
            second_seq,
            printf('%016x', second_parent_hash) AS second_parent_hash,
            second_num_tokens,
            second_lora_name,
            lower(hex(second_tokens_digest)) AS second_tokens_digest,
            second_token_ids
        FROM vllm_kv_conflicts
        ORDER BY second_epoch, second_seq, block_hash
        """
    )
