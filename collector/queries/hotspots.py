"""Which blocks are hot: the block x time heatmap, the most-hit block hashes, and how skewed
reuse is (how many cached blocks got how many hits while they stayed cached)."""

from __future__ import annotations

import math
from typing import Any, Literal

import pandas as pd

from collector.model.time_window import TimeWindow
from collector.queries.activity import buckets_per_point
from collector.store.reference_group import IN_REFERENCE_GROUP
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


HeatRows = Literal["family", "tenant"]


# `owner_heatmap`'s query, by its rows: the row key of each block (`blocks`, its
# `prefix_blocks` row).
_OWNER_HEATMAP = {
    rows: f"""
    WITH activity AS (
        SELECT ($first + ((ts_ns - grid.start_ns) // grid.bucket_ns - $first)
                // $points * $points) * grid.bucket_ns / 1e9 AS t_s,
            coalesce({key}, $none) AS row_key,
            count(*) FILTER (WHERE kind = 'hit') AS hits,
            count(*) FILTER (WHERE kind = 'store') AS stores,
            count(*) FILTER (WHERE kind = 'evict') AS evictions
        FROM (
            SELECT ts_ns, kind, block_hash FROM events
            WHERE kind IN ('hit', 'store', 'evict') AND ts_ns >= $start AND ts_ns < $end
                AND {IN_REFERENCE_GROUP}
        ) AS window_events
        LEFT JOIN prefix_blocks AS blocks USING (block_hash)
        CROSS JOIN rollup_grid AS grid
        GROUP BY ALL
    ),
    ranked AS (
        SELECT row_key,
            row_number() OVER (
                ORDER BY sum(hits + stores + evictions) DESC, row_key NULLS LAST
            ) AS rank
        FROM activity
        GROUP BY row_key
    ),
    folded AS (
        SELECT t_s,
            least(rank, $rows + 1) AS rank,
            CASE WHEN rank <= $rows THEN row_key END AS row_key,
            CAST(sum(hits) AS BIGINT) AS hits,
            CAST(sum(stores) AS BIGINT) AS stores,
            CAST(sum(evictions) AS BIGINT) AS evictions
        FROM activity
        JOIN ranked USING (row_key)
        GROUP BY ALL
    )
    SELECT folded.t_s, folded.rank, folded.row_key, root.tenant AS owner,
        folded.hits, folded.stores, folded.evictions
    FROM folded
    LEFT JOIN prefix_blocks AS root
        ON $by_family AND root.block_hash = TRY_CAST(folded.row_key AS UBIGINT)
    ORDER BY folded.rank, folded.t_s
    """
    for rows, key in (("family", "blocks.root_hash::VARCHAR"), ("tenant", "blocks.tenant"))
}


def owner_heatmap(
    run: RunFile,
    window: TimeWindow,
    rows: HeatRows,
    max_rows: int = 20,
    max_time_points: int = 200,
) -> pd.DataFrame:
    """Hits, stores and evictions per time point (`t_s`) and row: the blocks' prefix family
    (`row_key`: its first block's hash as text, "(unknown)" for a block not in
    `prefix_blocks`; `owner`: the tenant that first stored that first block) or the tenant
    that first stored each block (`row_key`, "(no tenant)" for none), of the
    reference KV cache group. The `max_rows` rows with the most activity in the window are
    kept (`rank` 1 = most); the rest are one row, `rank` max_rows + 1, `row_key` NULL."""
    return run.frame(
        _OWNER_HEATMAP[rows],
        {
            "first": window.first_bucket,
            "points": buckets_per_point(window, max_time_points),
            "start": window.start_ns,
            "end": window.end_ns,
            "rows": max_rows,
            "none": "(unknown)" if rows == "family" else "(no tenant)",
            "by_family": rows == "family",
        },
    )


_KINDS = {"hits": "hit", "stores": "store", "evictions": "evict"}


def _top_from_prefix_blocks(measure: str) -> str:
    """The block hashes with the most `measure` over the whole run, from the rollup."""
    return f"""
    SELECT block_hash, block_position, hits, stores, evictions,
        (first_use_ns - $origin) / 1e9 AS first_use_s,
        (last_use_ns - $origin) / 1e9 AS last_use_s,
        tenant, lora, CAST(root_hash AS VARCHAR) AS family
    FROM prefix_blocks
    WHERE {measure} > 0
    ORDER BY {measure} DESC, block_position, block_hash
    LIMIT $limit
"""


def _ranked_blocks(kind: str, counted_as: str) -> str:
    """The block hashes with the most `kind` rows in [$start, $end), at most $limit, counted
    from the events (as `counted_as`), in the reference KV cache group, as `prefix_blocks`
    counts them (collector/store/rollups.py)."""
    return f"""
        SELECT block_hash, count(*) AS {counted_as}, min(block_position) AS block_position
        FROM events
        WHERE kind = '{kind}' AND ts_ns >= $start AND ts_ns < $end AND {IN_REFERENCE_GROUP}
        GROUP BY block_hash
        ORDER BY {counted_as} DESC, block_position, block_hash
        LIMIT $limit
"""


# The most-hit block hashes in a window: what the prefix tree reads when the window is not
# the whole run.
HOT_BLOCKS = _ranked_blocks("hit", "hits")


def _top_from_events(measure: str) -> str:
    """The block hashes with the most `measure` in [$start, $end), with their other counts
    there (an evict row has no position: the hash's own, from `prefix_blocks`). `ranked` is
    read twice: MATERIALIZED computes its aggregate once."""
    return f"""
    WITH ranked AS MATERIALIZED ({_ranked_blocks(_KINDS[measure], "count")}    ),
    activity AS (
        SELECT block_hash,
            count(*) FILTER (WHERE kind = 'hit') AS hits,
            count(*) FILTER (WHERE kind = 'store') AS stores,
            count(*) FILTER (WHERE kind = 'evict') AS evictions,
            min(ts_ns) FILTER (WHERE kind IN ('hit', 'store')) AS first_use_ns,
            max(ts_ns) FILTER (WHERE kind IN ('hit', 'store')) AS last_use_ns
        FROM events
        WHERE kind IN ('hit', 'store', 'evict') AND ts_ns >= $start AND ts_ns < $end
            AND block_hash IN (SELECT block_hash FROM ranked) AND {IN_REFERENCE_GROUP}
        GROUP BY block_hash
    )
    SELECT ranked.block_hash,
        coalesce(ranked.block_position, prefix_blocks.block_position) AS block_position,
        activity.hits, activity.stores, activity.evictions,
        (activity.first_use_ns - $origin) / 1e9 AS first_use_s,
        (activity.last_use_ns - $origin) / 1e9 AS last_use_s,
        prefix_blocks.tenant, prefix_blocks.lora,
        CAST(prefix_blocks.root_hash AS VARCHAR) AS family
    FROM ranked
    JOIN activity USING (block_hash)
    LEFT JOIN prefix_blocks USING (block_hash)
    ORDER BY ranked.count DESC, block_position, ranked.block_hash
"""


def top_blocks(
    run: RunFile, window: TimeWindow, limit: int = 20, measure: str = "hits"
) -> pd.DataFrame:
    """The block hashes with the most `measure` (hits, stores or evictions) in the window,
    with their other counts, first and last use there, the tenant and adapter that first
    stored them, and their prefix `family` (its first block's hash, in decimal)."""
    if measure not in HEAT_MEASURES:
        raise ValueError(f"no such measure {measure!r}: {', '.join(HEAT_MEASURES)}")
    if window.is_whole_run:
        return _top_blocks(run, _top_from_prefix_blocks(measure), window, limit, events=False)
    return _top_blocks(run, _top_from_events(measure), window, limit, events=True)


def _top_blocks(
    run: RunFile, sql: str, window: TimeWindow, limit: int, *, events: bool
) -> pd.DataFrame:
    parameters: dict[str, int] = {"origin": window.run_start_ns, "limit": limit}
    if events:
        parameters |= {"start": window.start_ns, "end": window.end_ns}
    frame = run.frame(sql, parameters)
    frame["block_hash"] = frame["block_hash"].map(hash_hex)
    return frame


def block_runs(top: pd.DataFrame, measure: str, limit: int) -> pd.DataFrame:
    """`top_blocks` folded into runs of blocks alike: the blocks of one prefix family with
    the same hits, stores and evictions (a shared prefix's blocks are hit together) as one
    row, with their `blocks`, `first_position`..`last_position` and the `first_hash`; the
    `limit` runs with the most `measure`, as `top_blocks` ranks them."""
    keys = ["family", "hits", "stores", "evictions"]
    runs = (
        top.assign(family=top["family"].fillna(""), order=range(len(top)))
        .groupby(keys, sort=False)
        .agg(
            blocks=("block_hash", "size"),
            first_position=("block_position", "min"),
            last_position=("block_position", "max"),
            first_hash=("block_hash", "first"),
            tenant=("tenant", "first"),
            order=("order", "min"),
        )
        .reset_index()
        .sort_values([measure, "order"], ascending=[False, True])
    )
    return runs.drop(columns="order").head(limit).reset_index(drop=True)


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
