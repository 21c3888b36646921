"""What a run did in a time window, read from `time_rollup`: headline figures and the same
figures over time."""

from __future__ import annotations

from typing import cast

import pandas as pd

from collector.model.time_window import TimeWindow
from collector.queries.summary import HeadlineFigures, hit_ratio
from collector.store.run_file import RunFile

# Summed per bucket in `time_rollup`; all but the squares are `run_summary` figures.
_SUMMED = (
    "requests",
    "prompt_tokens",
    "hit_tokens",
    "tier_hit_tokens",
    "hit_tokens_squared",
    "prompt_tokens_squared",
    "prompt_blocks",
    "hit_blocks",
    "block_hits",
    "stores",
    "evictions",
    "preemptions",
    "resets",
    "collisions",
    "dropped_events",
)


class WindowFigures(HeadlineFigures):
    """The headline figures counted inside a window, the tokens an offload tier supplied
    beyond the GPU hits, and the sums of squared hit and prompt tokens the ROI's attention
    term needs."""

    tier_hit_tokens: int
    hit_tokens_squared: int
    prompt_tokens_squared: int


def window_figures(run: RunFile, window: TimeWindow) -> WindowFigures:
    """The headline figures of `run_summary`, counted inside the window."""
    sums = ", ".join(f"CAST(coalesce(sum({name}), 0) AS BIGINT) AS {name}" for name in _SUMMED)
    row = run.record(
        f"""
        SELECT {sums},
            CAST(coalesce(sum(event_rows + pool_rows + collisions), 0) AS BIGINT) AS events
        FROM time_rollup
        WHERE bucket BETWEEN $first AND $last
        """,
        {"first": window.first_bucket, "last": window.last_bucket},
    )
    assert row is not None
    figures = cast(WindowFigures, row)
    figures["token_hit_ratio"] = hit_ratio(figures["hit_tokens"], figures["prompt_tokens"])
    figures["block_hit_ratio"] = hit_ratio(figures["hit_blocks"], figures["prompt_blocks"])
    return figures


def figures_over_time(run: RunFile, window: TimeWindow, max_points: int = 60) -> pd.DataFrame:
    """The window's buckets regrouped into at most `max_points` points of whole buckets
    (`t_s`: a point's start, seconds from the run's first record; `width_s`: how long
    every point is, the same for all): every summed figure per
    point, the fewest free blocks, and the blocks holding a hash at the point's end
    (stores - evictions - blocks cleared by resets, counted from the start of the run)."""
    sums = ",\n".join(f"CAST(sum({name}) AS BIGINT) AS {name}" for name in _SUMMED)
    return run.frame(
        f"""
        WITH cached AS (
            SELECT *, sum(stores - evictions - cleared_blocks) OVER (ORDER BY bucket)
                AS cached_blocks
            FROM time_rollup
        ),
        points AS (
            SELECT *, (bucket - $first) // $group AS point
            FROM cached
            WHERE bucket BETWEEN $first AND $last
        )
        SELECT
            ($first + point * $group) * grid.bucket_ns / 1e9 AS t_s,
            $group * grid.bucket_ns / 1e9 AS width_s,
            {sums},
            min(min_free) AS min_free,
            CAST(arg_max(cached_blocks, bucket) AS BIGINT) AS cached_blocks
        FROM points, rollup_grid AS grid
        GROUP BY point, grid.bucket_ns
        ORDER BY t_s
        """,
        {
            "first": window.first_bucket,
            "last": window.last_bucket,
            "group": buckets_per_point(window, max_points),
        },
    )


def buckets_per_point(window: TimeWindow, max_points: int) -> int:
    """How many buckets one point of a chart takes so the window fits in `max_points`."""
    return -(-window.num_buckets // max_points)
