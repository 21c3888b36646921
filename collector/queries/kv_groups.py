"""A run's KV cache groups (a hybrid model's full-attention, sliding-window, chunked-local and
Mamba groups, all drawing blocks from one pool): what each stored, reused and lost, and the blocks
each held over time."""

from __future__ import annotations

import json

import pandas as pd

from collector.model.time_window import TimeWindow
from collector.queries.timeline import timeline_span
from collector.store.run_file import RunFile
from engine_hooks.layout import KvGroup

_LAST_BUCKET = 2**62  # past any run's last bucket: the whole run


def layout(run: RunFile) -> list[KvGroup]:
    """The run's groups as its options list them (kind, block size, window, layers), in
    vLLM's group order; one full-attention group for a run that does not say."""
    row = run.row("SELECT options, block_size FROM runs")
    options = json.loads(row[0]) if row and row[0] else {}
    groups = options.get("kv_groups") or []
    if not groups:
        block_size = int(row[1]) if row else 0
        return [KvGroup(kind="full", block_size=block_size)]
    return [
        KvGroup(
            kind=str(group["kind"]),
            block_size=int(group["block_size"]),
            window=int(group.get("window") or 0),
            num_layers=int(group.get("num_layers", 1)),
        )
        for group in groups
    ]


def describe(group: KvGroup) -> str:
    """A group as a phrase: "full attention", "sliding window of 128 tokens"."""
    kind, tokens = group.kind, group.window
    if kind == "sliding_window":
        return f"sliding window of {tokens:,} tokens"
    if kind == "chunked_local":
        return f"chunked local, {tokens:,}-token chunks"
    if kind == "mamba":
        return "Mamba state"
    return "full attention" if kind == "full" else kind


def group_figures(run: RunFile, window: TimeWindow | None = None) -> pd.DataFrame:
    """Per group: the blocks it allocated, stored, reused (block hits) and lost to eviction,
    the most blocks it held at once (pool records, from the collector's mirror of the
    stream), and where its hits started on average (0 for full attention; a window reuses
    only the blocks its window still reads); read from `group_rollup`, the window's buckets."""
    buckets = {
        "first": window.first_bucket if window else 0,
        "last": window.last_bucket if window else _LAST_BUCKET,
    }
    figures = run.frame(
        """
        SELECT kv_group,
            CAST(sum(allocated) AS BIGINT) AS allocated,
            CAST(sum(stored) AS BIGINT) AS stored,
            CAST(sum(block_hits) AS BIGINT) AS block_hits,
            CAST(sum(evicted) AS BIGINT) AS evicted,
            sum(hit_start_positions) / nullif(sum(hit_starts), 0) AS mean_hit_start,
            max(peak_in_use) AS peak_in_use
        FROM group_rollup
        WHERE bucket BETWEEN $first AND $last
        GROUP BY ALL
        """,
        buckets,
    )
    groups = layout(run)
    table = pd.DataFrame(
        {
            "kv_group": range(len(groups)),
            "kind": [describe(group) for group in groups],
            "num_layers": [group.num_layers for group in groups],
        }
    )
    table = table.merge(figures, on="kv_group", how="left")
    counts = ["allocated", "stored", "block_hits", "evicted"]
    table[counts] = table[counts].fillna(0).astype("int64")
    if table["peak_in_use"].isna().all() and len(groups) == 1:
        # One group, pool records without per-group counts: it holds every block in use.
        covered = timeline_span(run, window, 1)
        in_use = run.row(
            "SELECT max(num_in_use) FROM pool WHERE ts_ns >= $start AND ts_ns < $end",
            {"start": covered["start"], "end": covered["end"]},
        )
        table["peak_in_use"] = in_use[0] if in_use else None
    return table


def cut_short(run: RunFile, window: TimeWindow | None = None) -> dict[str, int]:
    """Lookups (first admissions) whose hit another group cut short: one group had cached
    the prefix further than every group could serve (vLLM's shared-prefix boundary), and the
    tokens between, which the request computed again; with every lookup's hit tokens."""
    covered = timeline_span(run, window, 1)
    row = run.row(
        """
        SELECT count(*) FILTER (WHERE cut > 0),
            coalesce(sum(cut) FILTER (WHERE cut > 0), 0),
            coalesce(sum(num_hit_tokens), 0)
        FROM (
            SELECT num_hit_tokens,
                coalesce(longest_group_hit_tokens, 0) - num_hit_tokens AS cut
            FROM events
            WHERE kind = 'lookup' AND NOT preempted AND ts_ns >= $start AND ts_ns < $end
        )
        """,
        {"start": covered["start"], "end": covered["end"]},
    )
    requests, tokens, hit_tokens = row if row else (0, 0, 0)
    return {"requests": int(requests), "tokens": int(tokens), "hit_tokens": int(hit_tokens)}


def in_use_timeline(
    run: RunFile, window: TimeWindow | None = None, max_points: int = 1_000
) -> pd.DataFrame:
    """The blocks each group held over time (t_s, kv_group, in_use), from pool records; long
    runs bucketed to about `max_points` points, each keeping its fullest moment. Empty for a
    run of one group (its in-use line is the free-block timeline's)."""
    return run.frame(
        """
        WITH bucketed AS (
            SELECT ($start - $origin + (ts_ns - $start) // $bucket * $bucket) / 1e9 AS t_s,
                arg_min(num_in_use_by_group, num_free) AS in_use_by_group
            FROM pool
            WHERE num_in_use_by_group IS NOT NULL AND ts_ns >= $start AND ts_ns < $end
            GROUP BY ALL
        )
        SELECT t_s, unnest(range(len(in_use_by_group))) AS kv_group,
            unnest(in_use_by_group) AS in_use
        FROM bucketed
        ORDER BY t_s, kv_group
        """,
        timeline_span(run, window, max_points),
    )
