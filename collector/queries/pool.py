"""The pool over time: free, cached-but-free and in-use blocks, the stretches it ran low,
its extremes, and evictions that were regretted (the block was asked for again)."""

from __future__ import annotations

from typing import TypedDict

import pandas as pd

from collector.model.time_window import TimeWindow
from collector.queries.timeline import timeline_span
from collector.store.run_file import RunFile

LOW_FREE_FRACTION = 0.10  # the pool's alarm line: under 10 % of it free


class RegretSummary(TypedDict):
    """Evictions, how many of the evicted blocks were stored again, and that share."""

    evictions: int
    restored: int
    regret_ratio: float


class FreeBlockExtremes(TypedDict):
    """The fewest free blocks, the usable pool, and how much of the run it spent under the
    alarm: a share of its pool steps, and seconds (each step's state holds until the next
    step: the stretches of `low_free_periods`, summed) with their share of the time the
    steps cover."""

    min_free_blocks: int
    usable_blocks: int
    low_free_step_share: float
    low_free_s: float
    low_free_time_share: float


def pool_timeline(
    run: RunFile,
    max_points: int = 2_000,
    window: TimeWindow | None = None,
) -> pd.DataFrame:
    """Free-but-uncached, cached-but-free and in-use blocks over time (in `window`, if given).

    Long runs are bucketed to about `max_points` points; each bucket keeps its fullest
    moment (fewest free blocks), so a dip toward empty never disappears from the chart. With
    several engines, each engine's fullest moment in the bucket, summed over the fleet.
    """
    return run.frame(
        """
        WITH per_engine AS (
            SELECT
                ($start - $origin + (ts_ns - $start) // $bucket * $bucket) / 1e9 AS t_s,
                arg_min(num_free - num_cached_free, num_free) AS free_uncached,
                arg_min(num_cached_free, num_free) AS cached_free,
                arg_min(num_in_use, num_free) AS in_use,
                min(num_free) AS free
            FROM pool
            WHERE ts_ns >= $start AND ts_ns < $end
            GROUP BY t_s, engine_id, dp_rank
        )
        SELECT t_s, sum(free_uncached) AS free_uncached, sum(cached_free) AS cached_free,
            sum(in_use) AS in_use, sum(free) AS free
        FROM per_engine
        GROUP BY t_s
        ORDER BY t_s
        """,
        timeline_span(run, window, max_points),
    )


def low_free_periods(
    run: RunFile,
    threshold: float = LOW_FREE_FRACTION,
    window: TimeWindow | None = None,
) -> pd.DataFrame:
    """Stretches when free blocks (cached-but-free included) were under `threshold` of the
    pool (in `window`, if given); with several engines, each engine's own."""
    covered = timeline_span(run, window, 1)
    return run.frame(
        """
        WITH marked AS (
            -- One ordering for both windows: a stretch is the low steps after the same
            -- number of steps that were not low, on the same engine.
            SELECT ts_ns, engine_id, dp_rank,
                num_free < $threshold * (num_free + num_in_use) AS low,
                lead(ts_ns) OVER by_seq AS next_ns,
                sum(CASE WHEN num_free < $threshold * (num_free + num_in_use) THEN 0 ELSE 1 END)
                    OVER by_seq AS stretch
            FROM pool
            WHERE ts_ns >= $start AND ts_ns < $end
            WINDOW by_seq AS (PARTITION BY engine_id, dp_rank ORDER BY seq)
        )
        SELECT
            (min(ts_ns) - $origin) / 1e9 AS start_s,
            (max(coalesce(next_ns, ts_ns)) - $origin) / 1e9 AS end_s,
            count(*) AS steps
        FROM marked
        WHERE low
        GROUP BY engine_id, dp_rank, stretch
        ORDER BY start_s
        """,
        {
            "origin": covered["origin"],
            "start": covered["start"],
            "end": covered["end"],
            "threshold": threshold,
        },
    )


_EVICTION_REGRET_SQL = """
    WITH evicted AS (
        SELECT seq, pos, ts_ns, block_id, block_hash, age_ns, num_hits,
            coalesce(engine_id, '') AS engine, coalesce(dp_rank, 0) AS rank
        FROM events WHERE kind = 'evict'
    ),
    stored AS (
        SELECT seq AS store_seq, ts_ns AS store_ns, block_hash,
            coalesce(engine_id, '') AS engine, coalesce(dp_rank, 0) AS rank
        FROM events WHERE kind = 'store'
    )
    SELECT evicted.* EXCLUDE (engine, rank), stored.store_ns - evicted.ts_ns AS restored_after_ns
    FROM evicted ASOF LEFT JOIN stored
        ON evicted.engine = stored.engine AND evicted.rank = stored.rank
        AND evicted.block_hash = stored.block_hash AND stored.store_seq > evicted.seq
"""


def eviction_regret(run: RunFile) -> pd.DataFrame:
    """Every eviction, and how long after it the same block hash was stored again on the
    same engine (NULL if never): an evicted block that comes back was needed and
    recomputed."""
    return run.frame(f"{_EVICTION_REGRET_SQL} ORDER BY seq, pos")


def eviction_regret_summary(run: RunFile, within_s: float | None = None) -> RegretSummary:
    """Evictions, how many came back (stored again; within `within_s` seconds if given),
    and that share."""
    row = run.row(
        f"""
        SELECT count(*),
            count(*) FILTER (WHERE restored_after_ns IS NOT NULL
                AND ($within_ns IS NULL OR restored_after_ns <= $within_ns))
        FROM ({_EVICTION_REGRET_SQL})
        """,
        {"within_ns": None if within_s is None else round(within_s * 1e9)},
    )
    evictions, restored = (0, 0) if row is None else (int(row[0]), int(row[1]))
    return {
        "evictions": evictions,
        "restored": restored,
        "regret_ratio": restored / evictions if evictions else 0.0,
    }


def free_block_extremes(
    run: RunFile,
    threshold: float = LOW_FREE_FRACTION,
    window: TimeWindow | None = None,
) -> FreeBlockExtremes:
    """The fewest free blocks seen, the pool's usable size, and the steps and the time spent
    under `threshold` of the pool free (in `window`, if given). With several engines: the
    fullest engine's fewest, the largest pool, and engine-seconds (each engine's steps held
    until its own next step), their share of all engines' time."""
    covered = timeline_span(run, window, 1)
    row = run.row(
        """
        WITH steps AS (
            SELECT num_free, num_free + num_in_use AS usable,
                num_free < $threshold * (num_free + num_in_use) AS low,
                coalesce(lead(ts_ns) OVER (PARTITION BY engine_id, dp_rank ORDER BY seq), ts_ns)
                    - ts_ns AS held_ns
            FROM pool
            WHERE ts_ns >= $start AND ts_ns < $end
        )
        SELECT min(num_free), max(usable), avg(low::INTEGER),
            coalesce(sum(held_ns) FILTER (WHERE low), 0), sum(held_ns)
        FROM steps
        """,
        {"start": covered["start"], "end": covered["end"], "threshold": threshold},
    )
    if row is None or row[0] is None:
        return {
            "min_free_blocks": 0,
            "usable_blocks": 0,
            "low_free_step_share": 0.0,
            "low_free_s": 0.0,
            "low_free_time_share": 0.0,
        }
    low_ns, held_ns = int(row[3]), int(row[4])
    return {
        "min_free_blocks": int(row[0]),
        "usable_blocks": int(row[1]),
        "low_free_step_share": float(row[2]),
        "low_free_s": low_ns / 1e9,
        "low_free_time_share": low_ns / held_ns if held_ns else 0.0,
    }


def eviction_times(run: RunFile, block_hashes: list[int]) -> pd.DataFrame:
    """When blocks with the given hashes were evicted."""
    return run.frame(
        """
        SELECT block_hash, ts_ns FROM events
        WHERE kind = 'evict' AND list_contains($hashes, block_hash)
        ORDER BY seq
        """,
        {"hashes": block_hashes},
    )
