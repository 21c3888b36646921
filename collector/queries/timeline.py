"""Named, parameterized queries over one run file, returning plain rows or data frames.

Times come back in seconds since the run's first record (`t_s`), so replays (the trace's
clock) and live runs (the engine's monotonic clock) read the same way.
"""

from __future__ import annotations

import json
from typing import Any

import duckdb
import pandas as pd

from collector.safe_text import shown
from collector.time_window import TimeWindow


def run_config(connection: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """The runs row: source, cache settings, versions, start and finish."""
    cursor = connection.execute("SELECT * FROM runs")
    names = [column[0] for column in cursor.description]
    row = cursor.fetchone()
    if row is None:
        raise LookupError("the run file has no runs row")
    return dict(zip(names, row, strict=True))


def describe_source(config: dict[str, Any]) -> str:
    """Where a run's records came from, as a phrase: "replay of TRACE", "live capture of
    engine host:123", "vLLM KV events from tcp://..."."""
    options = config.get("options") or {}
    if isinstance(options, str):
        options = json.loads(options)
    if config["source"] == "engine":
        return f"live capture of engine {shown(options.get('engine_id') or '?')}"
    if config["source"] == "vllm-kv-events":
        return f"vLLM KV events from {shown(options.get('endpoint') or '?')}"
    return f"{config['source']} of {shown(config['trace'])}"


def time_span_ns(connection: duckdb.DuckDBPyConnection) -> tuple[int, int]:
    """First and last record timestamps (ns); (0, 0) for an empty run."""
    row = connection.execute(
        "SELECT min(ts_ns), max(ts_ns) FROM "
        "(SELECT ts_ns FROM events UNION ALL SELECT ts_ns FROM pool)"
    ).fetchone()
    if row is None or row[0] is None:
        return 0, 0
    return int(row[0]), int(row[1])


def _covered(
    connection: duckdb.DuckDBPyConnection, window: TimeWindow | None, max_points: int
) -> dict[str, int]:
    """What a timeline covers: origin (the run's first record), start and end (exclusive),
    and a bucket long enough for about `max_points` points."""
    if window is None:
        origin, last = time_span_ns(connection)
        start, end = origin, last + 1
    else:
        origin, start, end = window.run_start_ns, window.start_ns, window.end_ns
    bucket = max((end - 1 - start) // max_points, 1)
    return {"origin": origin, "start": start, "end": end, "bucket": bucket}


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


def pool_timeline(
    connection: duckdb.DuckDBPyConnection,
    max_points: int = 2_000,
    window: TimeWindow | None = None,
) -> pd.DataFrame:
    """Free-but-uncached, cached-but-free and in-use blocks over time (in `window`, if given).

    Long runs are bucketed to about `max_points` points; each bucket keeps its fullest
    moment (fewest free blocks), so a dip toward empty never disappears from the chart.
    """
    return connection.execute(
        """
        SELECT
            ($start - $origin + (ts_ns - $start) // $bucket * $bucket) / 1e9 AS t_s,
            arg_min(num_free - num_cached_free, num_free) AS free_uncached,
            arg_min(num_cached_free, num_free) AS cached_free,
            arg_min(num_in_use, num_free) AS in_use,
            min(num_free) AS free
        FROM pool
        WHERE ts_ns >= $start AND ts_ns < $end
        GROUP BY ALL
        ORDER BY t_s
        """,
        _covered(connection, window, max_points),
    ).df()


def event_times(
    connection: duckdb.DuckDBPyConnection,
    kind: str,
    max_points: int = 400,
    window: TimeWindow | None = None,
) -> pd.DataFrame:
    """When events of one kind happened (in `window`, if given), bucketed: t_s and how many
    in each bucket."""
    return connection.execute(
        """
        SELECT ($start - $origin + (ts_ns - $start) // $bucket * $bucket) / 1e9 AS t_s,
            count(*) AS count
        FROM events
        WHERE kind = $kind AND ts_ns >= $start AND ts_ns < $end
        GROUP BY ALL
        ORDER BY t_s
        """,
        {**_covered(connection, window, max_points), "kind": kind},
    ).df()


def low_free_periods(
    connection: duckdb.DuckDBPyConnection,
    threshold: float = 0.10,
    window: TimeWindow | None = None,
) -> pd.DataFrame:
    """Stretches when free blocks (cached-but-free included) were under `threshold` of the
    pool (in `window`, if given)."""
    covered = _covered(connection, window, 1)
    return connection.execute(
        """
        WITH marked AS (
            -- One ordering for both windows: a stretch is the low steps after the same
            -- number of steps that were not low.
            SELECT ts_ns,
                num_free < $threshold * (num_free + num_in_use) AS low,
                lead(ts_ns) OVER by_seq AS next_ns,
                sum(CASE WHEN num_free < $threshold * (num_free + num_in_use) THEN 0 ELSE 1 END)
                    OVER by_seq AS stretch
            FROM pool
            WHERE ts_ns >= $start AND ts_ns < $end
            WINDOW by_seq AS (ORDER BY seq)
        )
        SELECT
            (min(ts_ns) - $origin) / 1e9 AS start_s,
            (max(coalesce(next_ns, ts_ns)) - $origin) / 1e9 AS end_s,
            count(*) AS steps
        FROM marked
        WHERE low
        GROUP BY stretch
        ORDER BY start_s
        """,
        {
            "origin": covered["origin"],
            "start": covered["start"],
            "end": covered["end"],
            "threshold": threshold,
        },
    ).df()


_EVICTION_REGRET_SQL = """
    WITH evicted AS (
        SELECT seq, pos, ts_ns, block_id, block_hash, age_ns, num_hits
        FROM events WHERE kind = 'evict'
    ),
    stored AS (
        SELECT seq AS store_seq, ts_ns AS store_ns, block_hash
        FROM events WHERE kind = 'store'
    )
    SELECT evicted.*, stored.store_ns - evicted.ts_ns AS restored_after_ns
    FROM evicted ASOF LEFT JOIN stored
        ON evicted.block_hash = stored.block_hash AND stored.store_seq > evicted.seq
"""


def eviction_regret(connection: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Every eviction, and how long after it the same block hash was stored again (NULL if
    never): an evicted block that comes back was needed and recomputed."""
    return connection.execute(f"{_EVICTION_REGRET_SQL} ORDER BY seq, pos").df()


def eviction_regret_summary(
    connection: duckdb.DuckDBPyConnection, within_s: float | None = None
) -> dict[str, float | int]:
    """Evictions, how many came back (stored again; within `within_s` seconds if given),
    and that share."""
    row = connection.execute(
        f"""
        SELECT count(*),
            count(*) FILTER (WHERE restored_after_ns IS NOT NULL
                AND ($within_ns IS NULL OR restored_after_ns <= $within_ns))
        FROM ({_EVICTION_REGRET_SQL})
        """,
        {"within_ns": None if within_s is None else round(within_s * 1e9)},
    ).fetchone()
    evictions, restored = (0, 0) if row is None else (int(row[0]), int(row[1]))
    return {
        "evictions": evictions,
        "restored": restored,
        "regret_ratio": restored / evictions if evictions else 0.0,
    }


def tenant_hit_ratios(connection: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Per tenant and LoRA adapter: requests, prompt and hit tokens, and the hit ratio."""
    return connection.execute(
        """
        SELECT
            coalesce(tenant, '(none)') AS tenant,
            coalesce(lora, '(none)') AS lora,
            count(*) AS requests,
            sum(num_prompt_tokens) AS prompt_tokens,
            sum(num_hit_tokens) AS hit_tokens,
            sum(num_hit_tokens) / nullif(sum(num_prompt_tokens), 0) AS hit_ratio
        FROM requests
        WHERE num_hit_tokens IS NOT NULL
        GROUP BY ALL
        ORDER BY tenant, lora
        """
    ).df()


def free_block_extremes(
    connection: duckdb.DuckDBPyConnection,
    threshold: float = 0.10,
    window: TimeWindow | None = None,
) -> dict[str, float | int]:
    """The fewest free blocks seen, the pool's usable size, and the share of steps spent
    under `threshold` of the pool free (in `window`, if given)."""
    covered = _covered(connection, window, 1)
    row = connection.execute(
        """
        SELECT min(num_free), max(num_free + num_in_use),
            avg(CASE WHEN num_free < $threshold * (num_free + num_in_use) THEN 1 ELSE 0 END)
        FROM pool
        WHERE ts_ns >= $start AND ts_ns < $end
        """,
        {"start": covered["start"], "end": covered["end"], "threshold": threshold},
    ).fetchone()
    if row is None or row[0] is None:
        return {"min_free_blocks": 0, "usable_blocks": 0, "low_free_step_share": 0.0}
    return {
        "min_free_blocks": int(row[0]),
        "usable_blocks": int(row[1]),
        "low_free_step_share": float(row[2]),
    }
