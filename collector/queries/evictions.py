"""What evicts what: the blocks evicted in a window, counted by the request whose allocation
evicted them (its prefix family, or its tenant) against the blocks' own (the family and the
tenant of the request that stored the copy evicted); and the prefix families whose evictions
were regretted most: evicted, then stored again because a request needed them.

A prefix family is every block hash under one first block (`prefix_blocks.root_hash`); a
request's family is its first block's. Evictions of the reference KV cache group are
counted (rollups.py), as the prefix rollups count them. An eviction by no request (vLLM's
`evict_blocks`, a KV connector's) has no evicting family or tenant.
"""

from __future__ import annotations

from typing import Literal

import pandas as pd

from collector.model.time_window import TimeWindow
from collector.store.reference_group import IN_REFERENCE_GROUP
from collector.store.run_file import RunFile

Axis = Literal["family", "tenant"]
AXES: tuple[Axis, ...] = ("family", "tenant")

# Each evicted block of the window: who evicted it, what it was.
_EVICTIONS_SQL = f"""
    WITH evicted AS (
        SELECT seq, ts_ns, block_id, block_hash, request_id
        FROM events
        WHERE kind = 'evict' AND ts_ns >= $start AND ts_ns < $end AND {IN_REFERENCE_GROUP}
    ),
    evicting_roots AS (
        SELECT request_id, any_value(block_hash) AS root_hash
        FROM events
        WHERE kind IN ('hit', 'store') AND block_position = 0 AND {IN_REFERENCE_GROUP}
            AND request_id IN (SELECT request_id FROM evicted)
        GROUP BY request_id
    ),
    lifetimes AS (
        SELECT store_seq, block_id, tenant, root_hash
        FROM cache_lifetimes
        WHERE {IN_REFERENCE_GROUP}
    ),
    stores AS (
        SELECT seq, ts_ns, block_hash FROM events WHERE kind = 'store' AND {IN_REFERENCE_GROUP}
    )
    SELECT
        evicted.seq,
        evicting_roots.root_hash AS evicting_family,
        requests.tenant AS evicting_tenant,
        lifetimes.root_hash AS evicted_family,
        lifetimes.tenant AS evicted_tenant,
        stores.ts_ns - evicted.ts_ns AS needed_again_after_ns
    FROM evicted
    LEFT JOIN evicting_roots USING (request_id)
    LEFT JOIN requests USING (request_id)
    ASOF LEFT JOIN lifetimes
        ON evicted.block_id = lifetimes.block_id AND lifetimes.store_seq < evicted.seq
    ASOF LEFT JOIN stores ON evicted.block_hash = stores.block_hash AND stores.seq > evicted.seq
"""


def eviction_matrix(run: RunFile, window: TimeWindow, axis: Axis) -> pd.DataFrame:
    """Blocks evicted in the window, by evicting x evicted family (`axis` "family": root
    hashes, NULL where no request evicted or the stored copy is unknown, each with the
    tenant that first stored it, its owner) or tenant (NULL: no tenant, or no request; no
    owners); one row per pair that evicted anything, most first."""
    if axis not in AXES:
        raise ValueError(f"no such axis {axis!r}: {', '.join(AXES)}")
    pairs = f"""
        SELECT evicting_{axis} AS evicting, evicted_{axis} AS evicted, count(*) AS evictions
        FROM ({_EVICTIONS_SQL})
        GROUP BY ALL
    """
    owned = (
        f"""
        SELECT pairs.*,
            evicting_root.tenant AS evicting_owner, evicted_root.tenant AS evicted_owner
        FROM ({pairs}) AS pairs
        LEFT JOIN prefix_blocks AS evicting_root ON evicting_root.block_hash = pairs.evicting
        LEFT JOIN prefix_blocks AS evicted_root ON evicted_root.block_hash = pairs.evicted
        """
        if axis == "family"
        else f"SELECT *, NULL AS evicting_owner, NULL AS evicted_owner FROM ({pairs})"
    )
    return run.frame(
        f"{owned} ORDER BY evictions DESC, evicting NULLS LAST, evicted NULLS LAST",
        {"start": window.start_ns, "end": window.end_ns},
    )


def regretted_families(run: RunFile, window: TimeWindow, limit: int = 10) -> pd.DataFrame:
    """The prefix families whose blocks evicted in the window were most often needed again
    (stored again, at any later time), with the tenant that first stored each (its owner):
    evictions, how many were needed again, that share, and the median seconds from eviction
    to being needed again; most needed again first."""
    return run.frame(
        f"""
        SELECT evicted_family AS family,
            any_value(root.tenant) AS owner,
            count(*) AS evictions,
            count(needed_again_after_ns) AS needed_again,
            count(needed_again_after_ns) / count(*) AS regret_share,
            median(needed_again_after_ns) / 1e9 AS median_needed_again_s
        FROM ({_EVICTIONS_SQL}) AS evicted
        LEFT JOIN prefix_blocks AS root ON root.block_hash = evicted.evicted_family
        WHERE evicted_family IS NOT NULL
        GROUP BY evicted_family
        HAVING count(needed_again_after_ns) > 0
        ORDER BY needed_again DESC, evictions DESC, family
        LIMIT $limit
        """,
        {"start": window.start_ns, "end": window.end_ns, "limit": limit},
    )
