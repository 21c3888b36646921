"""A fleet: one run's several engines (engine id x DP rank) side by side: what each was asked
and hit, how hard its pool ran, how evenly the load spread, and the blocks cached on more
than one engine at once (cross-replica duplication) with the memory those extra copies take.

Engines' clocks are compared as recorded: a fleet replay's share one clock, a live capture
of engines on one host their monotonic clock; engines on several hosts are as far apart in
time as those hosts' clocks are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypedDict

import pandas as pd

from collector.model.time_window import TimeWindow
from collector.queries.pool import LOW_FREE_FRACTION
from collector.queries.timeline import timeline_span
from collector.store.run_file import RunFile

UNNAMED_ENGINE = "(unnamed)"
# The engine of a row: a single-engine run's rows carry no id and rank 0.
_ENGINE = "coalesce(engine_id, '') AS engine_id, coalesce(dp_rank, 0) AS dp_rank"


class LoadImbalance(TypedDict):
    """The busiest engine's requests and prompt tokens over the fleet's mean (1.0: even)."""

    requests: float
    prompt_tokens: float


class DuplicationSummary(TypedDict):
    """Extra copies (blocks cached on an engine while another engine holds the same hash):
    the most at one moment and its share of the fleet's cached blocks then, the time-weighted
    mean and its share of the mean cached blocks, and the GiB of the peak and the mean."""

    peak_duplicated_blocks: int
    peak_share: float
    mean_duplicated_blocks: float
    mean_share: float
    peak_duplicated_gib: float
    mean_duplicated_gib: float


def num_engines(run: RunFile) -> int:
    """Distinct engines (engine id x DP rank) among the run's requests and pool snapshots
    (every engine that served a request has its arrivals and lookups: reading only those
    rows takes a tenth of reading every event of a large run)."""
    row = run.row(
        f"""
        SELECT count(*) FROM (
            SELECT DISTINCT {_ENGINE} FROM events WHERE kind IN ('arrive', 'lookup')
            UNION SELECT DISTINCT {_ENGINE} FROM pool
        )
        """
    )
    return 0 if row is None else int(row[0])


def engine_lineages(run: RunFile) -> dict[tuple[str, int], str]:
    """(engine id, DP rank) of each engine start the collector kept settings of -> the engine
    id its hooks announced: `ID #2`, a later start of an engine under KVSCOPE_ENGINE_ID `ID`,
    maps to `ID` (collector/live/engine_starts.py). Engines it never kept (a replay's, a
    capture's before the collector kept them) are their own lineage."""
    rows = run.rows(
        """SELECT value->>'engine_id', CAST(value->>'dp_rank' AS INTEGER),
            coalesce(value->>'announced_id', value->>'engine_id')
        FROM meta WHERE starts_with(key, 'engine_settings ')"""
    )
    return {(str(engine), int(rank)): str(announced) for engine, rank, announced in rows}


def lineage_ids(
    engine_ids: Iterable[str], dp_ranks: Iterable[int], lineages: Mapping[tuple[str, int], str]
) -> list[str]:
    """Each row's lineage (`engine_lineages`): the engine id its hooks announced, else its own."""
    return [
        lineages.get((str(engine_id), int(dp_rank)), str(engine_id))
        for engine_id, dp_rank in zip(engine_ids, dp_ranks, strict=True)
    ]


def engine_labels(engine_ids: Iterable[str], dp_ranks: Iterable[int]) -> list[str]:
    """Each row's engine name: its id (or "(unnamed)"), and its DP rank where that engine
    has ranks above 0 (every rank of it then named, rank 0 too)."""
    rows = list(zip(engine_ids, dp_ranks, strict=True))
    ranked = {engine_id for engine_id, dp_rank in rows if dp_rank}
    return [
        f"{engine_id or UNNAMED_ENGINE}" + f" dp{dp_rank}" * (engine_id in ranked)
        for engine_id, dp_rank in rows
    ]


def fleet_engines(
    run: RunFile, window: TimeWindow | None = None, threshold: float = LOW_FREE_FRACTION
) -> pd.DataFrame:
    """Per engine (in `window`, if given): requests first admitted, their prompt and hit
    tokens, the token hit ratio, evictions; the smallest free share of its pool, and the share
    of its pool steps' time spent under `threshold` free (each step holds until its next)."""
    span = timeline_span(run, window, 1)
    frame = run.frame(
        f"""
        WITH asked AS (
            SELECT {_ENGINE},
                count(*) FILTER (WHERE kind = 'lookup' AND NOT preempted) AS requests,
                sum(num_prompt_tokens) FILTER (WHERE kind = 'lookup' AND NOT preempted)
                    AS prompt_tokens,
                sum(num_hit_tokens) FILTER (WHERE kind = 'lookup' AND NOT preempted)
                    AS hit_tokens,
                count(*) FILTER (WHERE kind = 'evict') AS evictions
            FROM events
            WHERE kind IN ('lookup', 'evict') AND ts_ns >= $start AND ts_ns < $end
            GROUP BY ALL
        ),
        engines AS (  -- each engine asked or evicting, or reporting its pool, in the window
            SELECT engine_id, dp_rank FROM asked
            UNION SELECT DISTINCT {_ENGINE} FROM pool WHERE ts_ns >= $start AND ts_ns < $end
        ),
        steps AS (
            SELECT {_ENGINE}, num_free, num_free + num_in_use AS usable,
                coalesce(lead(ts_ns) OVER by_engine, ts_ns) - ts_ns AS held_ns
            FROM pool
            WHERE ts_ns >= $start AND ts_ns < $end
            WINDOW by_engine AS (
                PARTITION BY coalesce(engine_id, ''), coalesce(dp_rank, 0) ORDER BY seq
            )
        ),
        pressure AS (
            SELECT engine_id, dp_rank,
                min(num_free / nullif(usable, 0)) AS min_free_share,
                coalesce(sum(held_ns) FILTER (WHERE num_free < $threshold * usable), 0)
                    / nullif(sum(held_ns), 0) AS low_free_time_share
            FROM steps
            GROUP BY ALL
        )
        SELECT engine_id, dp_rank,
            coalesce(requests, 0) AS requests,
            CAST(coalesce(prompt_tokens, 0) AS BIGINT) AS prompt_tokens,
            CAST(coalesce(hit_tokens, 0) AS BIGINT) AS hit_tokens,
            coalesce(hit_tokens / nullif(prompt_tokens, 0), 0) AS hit_ratio,
            coalesce(evictions, 0) AS evictions,
            min_free_share,
            coalesce(low_free_time_share, 0) AS low_free_time_share
        FROM engines
        LEFT JOIN asked USING (engine_id, dp_rank)
        LEFT JOIN pressure USING (engine_id, dp_rank)
        ORDER BY engine_id, dp_rank
        """,
        {"start": span["start"], "end": span["end"], "threshold": threshold},
    )
    return frame.assign(engine=engine_labels(frame["engine_id"], frame["dp_rank"]))


def load_imbalance(engines: pd.DataFrame) -> LoadImbalance:
    """Max over mean of `fleet_engines`' requests and prompt tokens (0 when none)."""

    def ratio(column: str) -> float:
        mean = float(engines[column].mean()) if len(engines) else 0.0
        return float(engines[column].max()) / mean if mean else 0.0

    return {"requests": ratio("requests"), "prompt_tokens": ratio("prompt_tokens")}


def free_share_timeline(
    run: RunFile, window: TimeWindow | None = None, max_points: int = 500
) -> pd.DataFrame:
    """Per engine and time bucket: the smallest share of its pool free (its fullest moment)."""
    frame = run.frame(
        f"""
        SELECT {_ENGINE},
            ($start - $origin + (ts_ns - $start) // $bucket * $bucket) / 1e9 AS t_s,
            min(num_free / nullif(num_free + num_in_use, 0)) AS free_share
        FROM pool
        WHERE ts_ns >= $start AND ts_ns < $end
        GROUP BY ALL
        ORDER BY engine_id, dp_rank, t_s
        """,
        timeline_span(run, window, max_points),
    )
    return frame.assign(engine=engine_labels(frame["engine_id"], frame["dp_rank"]))


# The fleet's cache states (the run's `fleet_states`, collector/store/rollups.py) cut to the
# window [$start, $end): a lifetime cut to a window is the window's lifetime, so these are
# the states the window's lifetimes alone give.
_STATES_SQL = """
    WITH states AS (
        SELECT greatest(ts_ns, $start) AS ts_ns, least(until_ns, $end) AS until_ns,
            cached_blocks, duplicated_hashes, duplicated_blocks
        FROM fleet_states
        WHERE until_ns > $start AND ts_ns < $end
    )
"""


def fleet_duplication(
    run: RunFile, gib_per_block: float, window: TimeWindow | None = None, max_points: int = 500
) -> pd.DataFrame:
    """Per time bucket (in `window`, if given; about `max_points`): the most hashes cached on
    more than one engine at once and the most extra copies (blocks beyond the first engine's)
    with their GiB at `gib_per_block`; the time-weighted mean of extra and of all copies."""
    return run.frame(
        f"""
        {_STATES_SQL},
        pieces AS (
            SELECT *, unnest(range(
                (ts_ns - $start) // $bucket, (until_ns - 1 - $start) // $bucket + 1
            )) AS bucket
            FROM states WHERE until_ns > ts_ns
        ),
        bucket_pieces AS (
            SELECT *, least(until_ns, $start + (bucket + 1) * $bucket, $end)
                - greatest(ts_ns, $start + bucket * $bucket) AS overlap_ns,
                least($start + (bucket + 1) * $bucket, $end) - ($start + bucket * $bucket)
                    AS bucket_ns
            FROM pieces
        )
        SELECT ($start - $origin + bucket * $bucket) / 1e9 AS t_s,
            CAST(max(duplicated_hashes) AS BIGINT) AS duplicated_hashes,
            CAST(max(duplicated_blocks) AS BIGINT) AS duplicated_blocks,
            max(duplicated_blocks) * $gib_per_block AS duplicated_gib,
            sum(duplicated_blocks * overlap_ns) / any_value(bucket_ns) AS mean_duplicated_blocks,
            sum(cached_blocks * overlap_ns) / any_value(bucket_ns) AS mean_cached_blocks
        FROM bucket_pieces
        GROUP BY bucket
        ORDER BY bucket
        """,
        {**timeline_span(run, window, max_points), "gib_per_block": gib_per_block},
    )


def duplication_summary(
    run: RunFile, gib_per_block: float, window: TimeWindow | None = None
) -> DuplicationSummary:
    """The most extra copies at one moment and the time-weighted mean over the window, each
    with its share of the fleet's cached blocks and its GiB at `gib_per_block`."""
    span = timeline_span(run, window, 1)
    row = run.row(
        f"""
        {_STATES_SQL}
        SELECT coalesce(max(duplicated_blocks), 0),
            coalesce(arg_max(duplicated_blocks / nullif(cached_blocks, 0), duplicated_blocks), 0),
            coalesce(sum(duplicated_blocks * (until_ns - ts_ns)), 0) / ($end - $start),
            coalesce(sum(cached_blocks * (until_ns - ts_ns)), 0) / ($end - $start)
        FROM states
        """,
        {"start": span["start"], "end": span["end"]},
    )
    peak, peak_share, mean, mean_cached = row if row is not None else (0, 0.0, 0.0, 0.0)
    return {
        "peak_duplicated_blocks": int(peak),
        "peak_share": float(peak_share),
        "mean_duplicated_blocks": float(mean),
        "mean_share": float(mean) / float(mean_cached) if mean_cached else 0.0,
        "peak_duplicated_gib": int(peak) * gib_per_block,
        "mean_duplicated_gib": float(mean) * gib_per_block,
    }


def engine_starts(run: RunFile) -> pd.DataFrame:
    """Where each engine (engine id x DP rank) starts and stops: `t_s` and `end_s` (seconds
    from the run's first record) of its first and last records, and `pool_blocks`, its
    usable pool as its first pool step counts it (NULL: no pool steps); earliest first.
    Times are on the rollup grid's clock, as the time-range slider's. A restarted engine is
    another engine id (the hooks name it host:pid), so a restart shows as a new start.

    With each, the settings it ran with: `block_size`, `num_blocks` (its pool as the engine
    announced it, the null block included), `hash_algo`, `model`, `vllm_version` and
    `max_num_seqs`, as the collector kept them from its batches' headers
    (collector/live/announced.py). The engines of a run not captured live (a replay), and a
    run's only engine, ran with the run's settings; an engine of a live capture made before
    the collector kept each engine's has NULL."""
    return run.frame(
        f"""
        WITH rows AS (
            SELECT {_ENGINE}, ts_ns, NULL AS pool_blocks FROM events
            UNION ALL
            SELECT {_ENGINE}, ts_ns, num_free + num_in_use AS pool_blocks FROM pool
        ),
        starts AS (
            SELECT engine_id, dp_rank,
                (min(ts_ns) - (SELECT start_ns FROM rollup_grid)) / 1e9 AS t_s,
                (max(ts_ns) - (SELECT start_ns FROM rollup_grid)) / 1e9 AS end_s,
                CAST(arg_min(pool_blocks, ts_ns) FILTER (WHERE pool_blocks IS NOT NULL)
                    AS BIGINT) AS pool_blocks
            FROM rows
            GROUP BY ALL
        ),
        announced AS (
            SELECT DISTINCT value->>'engine_id' AS engine_id,
                CAST(value->>'dp_rank' AS INTEGER) AS dp_rank, CAST(value AS JSON) AS settings
            FROM meta
            WHERE starts_with(key, 'engine_settings ')
        ),
        run AS (
            SELECT source, block_size, num_blocks, hash_algo, vllm_version, max_num_seqs,
                nullif(options->>'model', '') AS model
            FROM runs
            LIMIT 1
        ),
        joined AS (
            SELECT starts.*, settings,
                settings IS NULL AND ((SELECT source FROM run) <> 'engine' OR count(*) OVER () = 1)
                    AS run_wide
            FROM starts
            LEFT JOIN announced USING (engine_id, dp_rank)
        )
        SELECT engine_id, dp_rank, t_s, end_s, pool_blocks,
            if(run_wide, block_size, CAST(settings->>'block_size' AS INTEGER)) AS block_size,
            if(run_wide, num_blocks, CAST(settings->>'num_blocks' AS INTEGER)) AS num_blocks,
            if(run_wide, hash_algo, settings->>'hash_algo') AS hash_algo,
            if(run_wide, model, nullif(settings->>'model', '')) AS model,
            if(run_wide, vllm_version, settings->>'vllm_version') AS vllm_version,
            nullif(if(run_wide, max_num_seqs, CAST(settings->>'max_num_seqs' AS INTEGER)), 0)
                AS max_num_seqs
        FROM joined, run
        ORDER BY t_s, engine_id, dp_rank
        """
    )
