"""Named, parameterized queries over one run file, returning plain rows or data frames.

Times come back in seconds since the run's first record (`t_s`), so replays (the trace's
clock) and live runs (the engine's monotonic clock) read the same way.
"""

from __future__ import annotations

from typing import Any

import duckdb
import pandas as pd


def run_config(connection: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """The runs row: source, cache settings, versions, start and finish."""
    cursor = connection.execute("SELECT * FROM runs")
    names = [column[0] for column in cursor.description]
    row = cursor.fetchone()
    if row is None:
        raise LookupError("the run file has no runs row")
    return dict(zip(names, row, strict=True))


def time_span_ns(connection: duckdb.DuckDBPyConnection) -> tuple[int, int]:
    """First and last record timestamps (ns); (0, 0) for an empty run."""
    row = connection.execute(
        "SELECT min(ts_ns), max(ts_ns) FROM "
        "(SELECT ts_ns FROM events UNION ALL SELECT ts_ns FROM pool)"
    ).fetchone()
    if row is None or row[0] is None:
        return 0, 0
    return int(row[0]), int(row[1])


def hit_rate_over_time(
    connection: duckdb.DuckDBPyConnection, num_buckets: int = 60
) -> pd.DataFrame:
    """Per time bucket: requests admitted, their prompt and hit tokens and blocks, evictions."""
    start_ns, end_ns = time_span_ns(connection)
    bucket_ns = max((end_ns - start_ns) // num_buckets, 1) if end_ns > start_ns else 1
    return connection.execute(
        """
        SELECT
            (ts_ns - $start) // $bucket * $bucket / 1e9 AS t_s,
            count(*) FILTER (WHERE kind = 'lookup' AND NOT preempted) AS requests,
            coalesce(sum(num_prompt_tokens) FILTER (WHERE kind = 'lookup' AND NOT preempted), 0)
                AS prompt_tokens,
            coalesce(sum(num_hit_tokens) FILTER (WHERE kind = 'lookup' AND NOT preempted), 0)
                AS hit_tokens,
            coalesce(sum((num_prompt_tokens + runs.block_size - 1) // runs.block_size)
                FILTER (WHERE kind = 'lookup' AND NOT preempted), 0) AS prompt_blocks,
            coalesce(sum(num_hit_blocks) FILTER (WHERE kind = 'lookup' AND NOT preempted), 0)
                AS hit_blocks,
            count(*) FILTER (WHERE kind = 'evict') AS evictions
        FROM events, runs
        WHERE kind IN ('lookup', 'evict')
        GROUP BY ALL
        ORDER BY t_s
        """,
        {"start": start_ns, "bucket": bucket_ns},
    ).df()


def pool_timeline(connection: duckdb.DuckDBPyConnection, max_points: int = 2_000) -> pd.DataFrame:
    """Free-but-uncached, cached-but-free and in-use blocks over time.

    Long runs are bucketed to about `max_points` points; each bucket keeps its fullest
    moment (fewest free blocks), so a dip toward empty never disappears from the chart.
    """
    start_ns, end_ns = time_span_ns(connection)
    bucket_ns = max((end_ns - start_ns) // max_points, 1)
    return connection.execute(
        """
        SELECT
            (ts_ns - $start) // $bucket * $bucket / 1e9 AS t_s,
            arg_min(num_free - num_cached_free, num_free) AS free_uncached,
            arg_min(num_cached_free, num_free) AS cached_free,
            arg_min(num_in_use, num_free) AS in_use,
            min(num_free) AS free
        FROM pool
        GROUP BY ALL
        ORDER BY t_s
        """,
        {"start": start_ns, "bucket": bucket_ns},
    ).df()


def event_times(
    connection: duckdb.DuckDBPyConnection, kind: str, max_points: int = 400
) -> pd.DataFrame:
    """When events of one kind happened, bucketed: t_s and how many in each bucket."""
    start_ns, end_ns = time_span_ns(connection)
    bucket_ns = max((end_ns - start_ns) // max_points, 1)
    return connection.execute(
        """
        SELECT (ts_ns - $start) // $bucket * $bucket / 1e9 AS t_s, count(*) AS count
        FROM events
        WHERE kind = $kind
        GROUP BY ALL
        ORDER BY t_s
        """,
        {"start": start_ns, "bucket": bucket_ns, "kind": kind},
    ).df()


def low_free_periods(
    connection: duckdb.DuckDBPyConnection, threshold: float = 0.10
) -> pd.DataFrame:
    """Stretches when free blocks (cached-but-free included) were under `threshold` of the pool."""
    start_ns, _ = time_span_ns(connection)
    return connection.execute(
        """
        WITH marked AS (
            SELECT ts_ns,
                num_free < $threshold * (num_free + num_in_use) AS low,
                lead(ts_ns) OVER (ORDER BY seq) AS next_ns
            FROM pool
        ),
        runs_of_low AS (
            SELECT *, sum(CASE WHEN low THEN 0 ELSE 1 END) OVER (ORDER BY ts_ns, next_ns) AS stretch
            FROM marked
        )
        SELECT
            (min(ts_ns) - $start) / 1e9 AS start_s,
            (max(coalesce(next_ns, ts_ns)) - $start) / 1e9 AS end_s,
            count(*) AS steps
        FROM runs_of_low
        WHERE low
        GROUP BY stretch
        ORDER BY start_s
        """,
        {"start": start_ns, "threshold": threshold},
    ).df()
