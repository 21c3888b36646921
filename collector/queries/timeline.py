"""When things happened in a run: its span, the rollups' time grid, the hit rate per time
bucket, and when events of one kind happened.

Times come back in seconds since the run's first record (`t_s`), so replays (the trace's
clock) and live runs (the engine's monotonic clock) read the same way.
"""

from __future__ import annotations

from datetime import timedelta

import pandas as pd

from collector.model.run_calendar import RunCalendar
from collector.model.time_window import TimeGrid, TimeWindow
from collector.store.run_file import RunFile
from collector.store.segmented_run import ORIGIN_KEY


def time_span_ns(run: RunFile) -> tuple[int, int]:
    """First and last record timestamps (ns); (0, 0) for an empty run."""
    row = run.row(
        "SELECT min(ts_ns), max(ts_ns) FROM "
        "(SELECT ts_ns FROM events UNION ALL SELECT ts_ns FROM pool)"
    )
    if row is None or row[0] is None:
        return 0, 0
    return int(row[0]), int(row[1])


def timeline_span(run: RunFile, window: TimeWindow | None, max_points: int) -> dict[str, int]:
    """What a timeline covers: origin (the run's first record), start and end (exclusive),
    and a bucket long enough for about `max_points` points."""
    if window is None:
        origin, last = time_span_ns(run)
        start, end = origin, last + 1
    else:
        origin, start, end = window.run_start_ns, window.start_ns, window.end_ns
    bucket = max((end - 1 - start) // max_points, 1)
    return {"origin": origin, "start": start, "end": end, "bucket": bucket}


def hit_rate_over_time(run: RunFile, num_buckets: int = 60) -> pd.DataFrame:
    """Per time bucket: requests admitted, their prompt and hit tokens and blocks, evictions."""
    start_ns, end_ns = time_span_ns(run)
    bucket_ns = max((end_ns - start_ns) // num_buckets, 1) if end_ns > start_ns else 1
    return run.frame(
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
    )


def event_times(
    run: RunFile,
    kind: str,
    max_points: int = 400,
    window: TimeWindow | None = None,
) -> pd.DataFrame:
    """When events of one kind happened (in `window`, if given), bucketed: t_s and how many
    in each bucket."""
    return run.frame(
        """
        SELECT ($start - $origin + (ts_ns - $start) // $bucket * $bucket) / 1e9 AS t_s,
            count(*) AS count
        FROM events
        WHERE kind = $kind AND ts_ns >= $start AND ts_ns < $end
        GROUP BY ALL
        ORDER BY t_s
        """,
        {**timeline_span(run, window, max_points), "kind": kind},
    )


def time_grid(run: RunFile) -> TimeGrid:
    """The grid `finalize` built the rollups on."""
    row = run.row("SELECT start_ns, end_ns, bucket_ns, block_bin_size FROM rollup_grid")
    if row is None:
        raise LookupError("the run file has no rollup_grid row")
    return TimeGrid(*(int(value) for value in row))


def run_calendar(run: RunFile) -> RunCalendar:
    """The run's grid on the wall clock: its first record at the run's `started_at`; where
    retention dropped it (a segmented run's `first_record_ns`), the first kept record that
    much later."""
    row = run.row("SELECT started_at FROM runs")
    if row is None:
        raise LookupError("the run file has no runs row")
    grid = time_grid(run)
    dropped = run.row(f"SELECT value FROM meta WHERE key = '{ORIGIN_KEY}'")
    later_s = max(grid.start_ns - int(dropped[0]), 0) / 1e9 if dropped else 0.0
    return RunCalendar(grid, row[0] + timedelta(seconds=later_s))
