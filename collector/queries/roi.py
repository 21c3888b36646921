"""Return on the prefix cache, read from a run: the block-seconds its cached blocks held,
and the prefixes that saved the most (priced by `collector.model.cost`)."""

from __future__ import annotations

import pandas as pd

from collector.model.time_window import TimeWindow
from collector.store.run_file import RunFile

# How long a cached block was held inside the window, and whether it was at all.
_OVERLAP = "least(ended_ns, $end) - greatest(stored_ns, $start)"
_OVERLAPS = "stored_ns < $end AND ended_ns > $start"


def held_block_seconds(run: RunFile, window: TimeWindow) -> float:
    """Block-seconds that cached blocks were held inside the window (every lifetime's overlap
    with it)."""
    row = run.row(
        f"SELECT coalesce(sum({_OVERLAP}), 0) / 1e9 FROM cache_lifetimes WHERE {_OVERLAPS}",
        {"start": window.start_ns, "end": window.end_ns},
    )
    return float(row[0]) if row else 0.0


def prefix_savings(run: RunFile, window: TimeWindow, limit: int = 15) -> pd.DataFrame:
    """Per prefix family (block hashes sharing a first block), the `limit` most hit in the
    window: block hits, the sum of their positions (for attention), block-seconds its
    blocks were held, and who stored the first block."""
    return run.frame(
        f"""
        WITH hits AS MATERIALIZED (
            SELECT root_hash, sum(block_hits) AS block_hits,
                sum(position_hits) AS position_hits
            FROM family_hits
            WHERE bucket BETWEEN $first AND $last
            GROUP BY root_hash
            ORDER BY block_hits DESC, root_hash
            LIMIT $limit
        ),
        held AS (
            SELECT root_hash, sum({_OVERLAP}) / 1e9 AS block_seconds
            FROM cache_lifetimes
            WHERE {_OVERLAPS} AND root_hash IN (SELECT root_hash FROM hits)
            GROUP BY root_hash
        )
        SELECT hits.root_hash, CAST(hits.block_hits AS BIGINT) AS block_hits,
            CAST(hits.position_hits AS BIGINT) AS position_hits,
            coalesce(held.block_seconds, 0) AS block_seconds,
            root.tenant, root.lora, root.first_stored_by
        FROM hits
        LEFT JOIN held USING (root_hash)
        LEFT JOIN prefix_blocks AS root ON root.block_hash = hits.root_hash
        ORDER BY hits.block_hits DESC, hits.root_hash
        """,
        {
            "start": window.start_ns,
            "end": window.end_ns,
            "first": window.first_bucket,
            "last": window.last_bucket,
            "limit": limit,
        },
    )
