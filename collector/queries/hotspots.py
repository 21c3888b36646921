"""Which blocks are hot: the block x time heatmap, the most-hit block hashes, and how skewed
reuse is (how many cached blocks got how many hits while they stayed cached)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from collector.model.time_window import TimeWindow
from collector.queries.activity import buckets_per_point
from collector.store.rollups import IN_REFERENCE_GROUP
from collector.store.run_file import RunFile

HEAT_MEASURES = ("hits", "stores", "evictions")


def block_heatmap(
    run: RunFile, window: TimeWindow, max_time_points: int = 200, kv_group: int | None = None
) -> pd.DataFrame:
    """Hits, stores and evictions per block bin (`block_start`: its first block id, bins of
    `rollup_grid.block_bin_size` blocks) and time point (`t_s`: its start) in the window, of
    one KV cache group's blocks (None: every group's)."""
    return run.frame(
        """
        SELECT
            ($first + (bucket - $first) // $points * $points) * grid.bucket_ns / 1e9 AS t_s,
            block_bin * grid.block_bin_size AS block_start,
            CAST(sum(hits) AS BIGINT) AS hits,
            CAST(sum(stores) AS BIGINT) AS stores,
            CAST(sum(evictions) AS BIGINT) AS evictions
        FROM block_heat, rollup_grid AS grid
        WHERE bucket BETWEEN $first AND $last
            AND ($kv_group IS NULL OR block_heat.kv_group = $kv_group)
        GROUP BY ALL
        ORDER BY t_s, block_start
        """,
        {
            "first": window.first_bucket,
            "last": window.last_bucket,
            "points": buckets_per_point(window, max_time_points),
            "kv_group": kv_group,
        },
    )


_TOP_FROM_PREFIX_BLOCKS = """
    SELECT block_hash, block_position, hits, stores, evictions,
        (first_use_ns - $origin) / 1e9 AS first_use_s,
        (last_use_ns - $origin) / 1e9 AS last_use_s,
        tenant, lora
    FROM prefix_blocks
    WHERE hits > 0
    ORDER BY hits DESC, block_position, block_hash
    LIMIT $limit
"""

# The most-hit block hashes in [$start, $end), at most $limit, counted from the events: what
# the top-blocks list and the prefix tree read when the window is not the whole run. In the
# reference KV cache group, as `prefix_blocks` counts them (collector/store/rollups.py).
HOT_BLOCKS = f"""
        SELECT block_hash, count(*) AS hits, min(block_position) AS block_position
        FROM events
        WHERE kind = 'hit' AND ts_ns >= $start AND ts_ns < $end AND {IN_REFERENCE_GROUP}
        GROUP BY block_hash
        ORDER BY hits DESC, block_position, block_hash
        LIMIT $limit
"""

# `hot` is read twice: MATERIALIZED computes its aggregate once.
_TOP_FROM_EVENTS = f"""
    WITH hot AS MATERIALIZED ({HOT_BLOCKS}    ),
    activity AS (
        SELECT block_hash,
            count(*) FILTER (WHERE kind = 'store') AS stores,
            count(*) FILTER (WHERE kind = 'evict') AS evictions,
            min(ts_ns) FILTER (WHERE kind IN ('hit', 'store')) AS first_use_ns,
            max(ts_ns) FILTER (WHERE kind IN ('hit', 'store')) AS last_use_ns
        FROM events
        WHERE kind IN ('hit', 'store', 'evict') AND ts_ns >= $start AND ts_ns < $end
            AND block_hash IN (SELECT block_hash FROM hot) AND {IN_REFERENCE_GROUP}
        GROUP BY block_hash
    )
    SELECT hot.block_hash, hot.block_position, hot.hits, activity.stores, activity.evictions,
        (activity.first_use_ns - $origin) / 1e9 AS first_use_s,
        (activity.last_use_ns - $origin) / 1e9 AS last_use_s,
        prefix_blocks.tenant, prefix_blocks.lora
    FROM hot
    JOIN activity USING (block_hash)
    LEFT JOIN prefix_blocks USING (block_hash)
    ORDER BY hot.hits DESC, hot.block_position, hot.block_hash
"""


def top_blocks(run: RunFile, window: TimeWindow, limit: int = 20) -> pd.DataFrame:
    """The block hashes hit most in the window, with their stores, evictions, first and last
    use there, and the tenant and adapter that first stored them."""
    sql = _TOP_FROM_PREFIX_BLOCKS if window.is_whole_run else _TOP_FROM_EVENTS
    return _top_blocks(run, sql, window, limit)


def _top_blocks(run: RunFile, sql: str, window: TimeWindow, limit: int) -> pd.DataFrame:
    parameters: dict[str, Any] = {"origin": window.run_start_ns, "limit": limit}
    if sql is _TOP_FROM_EVENTS:
        parameters |= {"start": window.start_ns, "end": window.end_ns}
    frame = run.frame(sql, parameters)
    frame["block_hash"] = frame["block_hash"].map(hash_hex)
    return frame


def hit_count_frequencies(
    run: RunFile, window: TimeWindow, kv_group: int | None = None
) -> pd.DataFrame:
    """Blocks cached (stored) in the window, of one KV cache group (None: every group's),
    counted by the hits each got while it stayed cached: `blocks` cache lifetimes had `hits`
    hits."""
    return run.frame(
        """
        SELECT hits, count(*) AS blocks
        FROM cache_lifetimes
        WHERE stored_ns >= $start AND stored_ns < $end
            AND ($kv_group IS NULL OR kv_group = $kv_group)
        GROUP BY hits
        ORDER BY hits
        """,
        {"start": window.start_ns, "end": window.end_ns, "kv_group": kv_group},
    )


def hit_count_histogram(frequencies: pd.DataFrame) -> pd.DataFrame:
    """Frequencies in bins 0, 1, 2, 3-4, 5-8, ...: blocks and hits per bin."""
    rows: dict[int, dict[str, Any]] = {}
    for hits, blocks in zip(frequencies["hits"], frequencies["blocks"], strict=True):
        low, high = _hit_bin(int(hits))
        label = str(low) if low == high else f"{low}-{high}"
        row = rows.setdefault(low, {"bin": label, "low": low, "high": high, "blocks": 0, "hits": 0})
        row["blocks"] += int(blocks)
        row["hits"] += int(hits) * int(blocks)
    return pd.DataFrame(
        [rows[low] for low in sorted(rows)],
        columns=["bin", "low", "high", "blocks", "hits"],
    )


def _hit_bin(hits: int) -> tuple[int, int]:
    """The bin of a hit count: 0, 1, 2, then powers of two (3-4, 5-8, 9-16, ...)."""
    if hits <= 2:
        return hits, hits
    high = 1 << (hits - 1).bit_length()
    return high // 2 + 1, high


def reuse_skew(frequencies: pd.DataFrame) -> dict[str, float | int]:
    """Cached blocks, their hits, the share of hits that went to the most-hit 1 % and 10 %
    of them, and the share never hit."""
    ordered = frequencies.sort_values("hits", ascending=False)
    num_blocks = int(ordered["blocks"].sum())
    num_hits = int((ordered["hits"] * ordered["blocks"]).sum())
    never_hit = int(ordered.loc[ordered["hits"] == 0, "blocks"].sum())

    def top_share(fraction: float) -> float:
        wanted = math.ceil(fraction * num_blocks)
        taken_hits = 0
        for hits, blocks in zip(ordered["hits"], ordered["blocks"], strict=True):
            take = min(int(blocks), wanted)
            taken_hits += take * int(hits)
            wanted -= take
            if wanted == 0:
                break
        return taken_hits / num_hits if num_hits else 0.0

    return {
        "blocks": num_blocks,
        "hits": num_hits,
        "top_1pct_hit_share": top_share(0.01),
        "top_10pct_hit_share": top_share(0.10),
        "never_hit_share": never_hit / num_blocks if num_blocks else 0.0,
    }


def hash_hex(block_hash: int | None) -> str:
    """A 64-bit block hash as 16 hex digits (how every page names a block)."""
    return "" if block_hash is None or pd.isna(block_hash) else f"{int(block_hash):016x}"
