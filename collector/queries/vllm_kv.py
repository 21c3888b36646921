"""Named queries over what a run got from vLLM's own KV events (the vllm_kv_* tables).

Times are seconds since the run's first vLLM batch (`t_s`), on the engine's wall clock.
"""

from __future__ import annotations

import pandas as pd

from collector.store.run_file import RunFile


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


def vllm_kv_activity(run: RunFile, num_buckets: int = 60) -> pd.DataFrame:
    """Per time bucket: blocks stored, blocks removed, and whole-cache clears."""
    row = run.row("SELECT min(ts_ns), max(ts_ns) FROM vllm_kv_events")
    start_ns, end_ns = (0, 0) if row is None or row[0] is None else (int(row[0]), int(row[1]))
    bucket_ns = max((end_ns - start_ns) // num_buckets, 1)
    return run.frame(
        """
        SELECT
            (ts_ns - $start) // $bucket * $bucket / 1e9 AS t_s,
            count(*) FILTER (WHERE kind = 'stored') AS stored,
            count(*) FILTER (WHERE kind = 'removed') AS removed,
            count(*) FILTER (WHERE kind = 'cleared') AS cleared
        FROM vllm_kv_events
        GROUP BY ALL
        ORDER BY t_s
        """,
        {"start": start_ns, "bucket": bucket_ns},
    )


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
