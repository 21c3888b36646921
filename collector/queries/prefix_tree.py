"""The prefix tree: block hashes chained by their parent hashes, the hottest drawn as a tree;
one block's history; the token ids of a prefix (when the run recorded them).

Hits are prefix-closed: a lookup that hits a block hits its parent too, so a parent never has
fewer hits than its children together. The hottest blocks, ordered by hits and then by
position, therefore always include every ancestor of every block they include.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from collector.model.time_window import TimeWindow
from collector.queries.hotspots import HOT_BLOCKS, hash_hex
from collector.store.run_file import RunFile

_NODES_FROM_PREFIX_BLOCKS = """
    SELECT block_hash, parent_hash, block_position, hits, tenant, lora,
        (first_stored_ns - $origin) / 1e9 AS first_stored_s
    FROM prefix_blocks
    WHERE hits > 0
    ORDER BY hits DESC, block_position, block_hash
    LIMIT $limit
"""

_NODES_FROM_EVENTS = f"""
    WITH hot AS ({HOT_BLOCKS}    )
    SELECT hot.block_hash, prefix_blocks.parent_hash, hot.block_position, hot.hits,
        prefix_blocks.tenant, prefix_blocks.lora,
        (prefix_blocks.first_stored_ns - $origin) / 1e9 AS first_stored_s
    FROM hot
    LEFT JOIN prefix_blocks USING (block_hash)
    ORDER BY hot.hits DESC, hot.block_position, hot.block_hash
"""


_MERGED_COLUMNS = (
    "block_hash",
    "parent",
    "first_position",
    "block_position",
    "blocks",
    "hits",
    "tenant",
    "lora",
    "first_stored_s",
)


def tree_nodes(run: RunFile, window: TimeWindow, max_nodes: int = 300) -> pd.DataFrame:
    """The `max_nodes` block hashes hit most in the window (ids and parents as hex; a block
    whose parent is not among them has parent ""), with the tenant and adapter that first
    stored each and when (`first_stored_s`)."""
    parameters: dict[str, int] = {"origin": window.run_start_ns, "limit": max_nodes}
    if window.is_whole_run:
        sql = _NODES_FROM_PREFIX_BLOCKS
    else:
        sql = _NODES_FROM_EVENTS
        parameters |= {"start": window.start_ns, "end": window.end_ns}
    nodes = run.frame(sql, parameters)
    nodes["block_hash"] = nodes["block_hash"].map(hash_hex)
    parents = nodes["parent_hash"].map(hash_hex)
    nodes["parent"] = parents.where(parents.isin(set(nodes["block_hash"])), "")
    return nodes.drop(columns="parent_hash")


def merge_unbranched(nodes: pd.DataFrame) -> pd.DataFrame:
    """Runs of blocks where each has one child with as many hits become one node: named after
    its last block, spanning positions `first_position..block_position` (`blocks` long)."""
    hits = dict(zip(nodes["block_hash"], nodes["hits"], strict=True))
    children: dict[str, list[str]] = defaultdict(list)
    for block, parent in zip(nodes["block_hash"], nodes["parent"], strict=True):
        children[parent].append(block)

    def continues(block: str) -> str | None:
        below = children.get(block, [])
        return below[0] if len(below) == 1 and hits[below[0]] == hits[block] else None

    rows = nodes.set_index("block_hash")
    merged: list[dict[str, Any]] = []
    heads = [
        block
        for block, parent in zip(nodes["block_hash"], nodes["parent"], strict=True)
        if parent == "" or continues(parent) != block
    ]
    for head in heads:
        tail = head
        while (following := continues(tail)) is not None:
            tail = following
        first = rows.loc[head]
        merged.append(
            {
                "block_hash": tail,
                "parent": first["parent"],
                "first_position": int(first["block_position"]),
                "block_position": int(rows.loc[tail, "block_position"]),
                "blocks": int(rows.loc[tail, "block_position"] - first["block_position"]) + 1,
                "hits": int(first["hits"]),
                "tenant": first["tenant"],
                "lora": first["lora"],
                "first_stored_s": first["first_stored_s"],
            }
        )
    return pd.DataFrame(merged, columns=list(_MERGED_COLUMNS))


def single_blocks(nodes: pd.DataFrame) -> pd.DataFrame:
    """Nodes of `tree_nodes` shaped like `merge_unbranched`'s, one block each."""
    shaped = nodes.assign(first_position=nodes["block_position"], blocks=1)
    return shaped[list(_MERGED_COLUMNS)]


def chain_to(nodes: pd.DataFrame, block: str) -> list[str]:
    """The block ids from the tree's root down to `block`, following `parent`."""
    parents = dict(zip(nodes["block_hash"], nodes["parent"], strict=True))
    chain = [block]
    while parents.get(chain[-1], ""):
        chain.append(parents[chain[-1]])
    return chain[::-1]


# A block hash's hits, stores and evictions in a window, in the order they happened.
NODE_EVENTS = """
SELECT ts_ns, CAST(kind AS VARCHAR) AS kind, request_id, block_id
FROM events
WHERE block_hash = $hash AND kind IN ('hit', 'store', 'evict')
    AND ts_ns >= $start AND ts_ns < $end
ORDER BY seq, pos
"""

# A block hash's re-stores in a window, and what the whole run knows of it.
NODE_FIGURES = """
WITH restored AS (
    SELECT count(*) FILTER (WHERE stored_ns >= $start AND stored_ns < $end
        AND store_seq > first_store_seq) AS restores
    FROM (
        SELECT stored_ns, store_seq, min(store_seq) OVER () AS first_store_seq
        FROM cache_lifetimes WHERE block_hash = $hash
    )
)
SELECT restored.restores, prefix_blocks.block_position, prefix_blocks.parent_hash,
    prefix_blocks.tenant, prefix_blocks.lora, prefix_blocks.first_stored_by,
    prefix_blocks.cached_ns / 1e9 AS cached_s
FROM prefix_blocks, restored
WHERE prefix_blocks.block_hash = $hash
"""


@dataclass(frozen=True)
class NodeSummary:
    """One block hash's figures: in the window, its hits, stores, re-stores (stores after its
    first ever), evictions, requests that hit or stored it, first and last use (seconds from
    the run's start); from the whole run, its position, parent (hex, "" for a root), the
    tenant and adapter that first stored it, the request that did and the time it was cached."""

    hits: int
    stores: int
    restores: int
    evictions: int
    requests: int
    first_use_s: float | None
    last_use_s: float | None
    block_position: int
    parent_hash: str
    tenant: str | None
    lora: str | None
    first_stored_by: str
    cached_s: float


@dataclass(frozen=True)
class NodeDetails:
    """One block hash in a window: its figures (`summary`) and its first hits, stores and
    evictions (`history`)."""

    summary: NodeSummary
    history: pd.DataFrame


def node_details(
    run: RunFile, block_hash: int, window: TimeWindow, history_rows: int = 500
) -> NodeDetails:
    """One block hash in the window, from one scan of its events.

    The summary: hits, stores, re-stores (stores after its first ever), evictions, requests
    that hit or stored it, first and last use; and from the whole run: position, parent,
    who first stored it, time cached. The history: its first `history_rows` hits, stores and
    evictions, with the request behind each (for an eviction: the request that took the
    block) and its tenant."""
    used = run.frame(
        NODE_EVENTS,
        {"hash": block_hash, "start": window.start_ns, "end": window.end_ns},
    )
    row = run.record(
        NODE_FIGURES,
        {"hash": block_hash, "start": window.start_ns, "end": window.end_ns},
    )
    if row is None:
        raise LookupError(f"block hash {block_hash:016x} is not in this run")
    kinds = used["kind"]
    touched = used[kinds != "evict"]

    def seconds(ts_ns: Any) -> float | None:
        return None if pd.isna(ts_ns) else (int(ts_ns) - window.run_start_ns) / 1e9

    summary = NodeSummary(
        hits=int((kinds == "hit").sum()),
        stores=int((kinds == "store").sum()),
        restores=row["restores"],
        evictions=int((kinds == "evict").sum()),
        requests=int(touched["request_id"].nunique()),
        first_use_s=seconds(touched["ts_ns"].min()),
        last_use_s=seconds(touched["ts_ns"].max()),
        block_position=row["block_position"],
        parent_hash=hash_hex(row["parent_hash"]),
        tenant=row["tenant"],
        lora=row["lora"],
        first_stored_by=row["first_stored_by"],
        cached_s=row["cached_s"],
    )
    return NodeDetails(summary, _history(run, used.head(history_rows), window.run_start_ns))


def _history(run: RunFile, used: pd.DataFrame, origin_ns: int) -> pd.DataFrame:
    """`used` rows with their times from the run's start and their requests' tenants."""
    owners = run.frame(
        """
        SELECT request_id, tenant, lora FROM requests
        WHERE request_id IN (SELECT unnest($ids))
        """,
        {"ids": sorted(set(used["request_id"].dropna()))},
    )
    history = used.assign(t_s=(used["ts_ns"] - origin_ns) / 1e9).merge(
        owners, on="request_id", how="left"
    )
    columns = ["t_s", "kind", "request_id", "tenant", "lora", "block_id"]
    return history[columns].astype({"tenant": object, "lora": object}).replace({np.nan: None})


def has_token_ids(run: RunFile) -> bool:
    """Whether the run recorded block token ids (`--record-token-ids`)."""
    row = run.row("SELECT EXISTS (SELECT 1 FROM block_tokens)")
    return bool(row and row[0])


def block_token_ids(run: RunFile, blocks: Iterable[str]) -> dict[str, list[int]]:
    """The recorded token ids of each of `blocks` (ids as hex), read in one pass; a block
    whose tokens were not recorded is left out."""
    rows = run.rows(
        """
        SELECT block_hash, any_value(token_ids) AS token_ids
        FROM block_tokens
        WHERE block_hash IN (SELECT CAST(unnest($hashes) AS UBIGINT))
        GROUP BY block_hash
        """,
        {"hashes": sorted({str(int(block, 16)) for block in blocks})},
    )
    return {hash_hex(block_hash): list(token_ids) for block_hash, token_ids in rows}


def chain_token_ids(
    tokens: dict[str, list[int]], chains: list[list[str]]
) -> list[list[int] | None]:
    """The token ids of each chain of block ids (hex, root first) from `block_token_ids`;
    None for a chain with a block whose tokens are not there."""
    return [
        [token for block in chain for token in tokens[block]]
        if all(block in tokens for block in chain)
        else None
        for chain in chains
    ]
