"""Writes what vLLM's KV events carry into a run file: batches, one row per block, gaps, and
the hash conflicts found on the way, as Arrow tables in one transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from collector.store.run_file import RunStore
from collector.vllm_kv.conflicts import BlockDescription, HashConflict, HashConflictDetector
from collector.vllm_kv.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Gap,
    ReceivedBatch,
    WireBlockHash,
    block_extra_keys,
    describes_each_block,
    hash64,
    num_extra_keys,
)

BATCH_COLUMNS: dict[str, pa.DataType] = {
    "endpoint": pa.string(),
    "dp_rank": pa.int16(),
    "epoch": pa.int32(),
    "seq": pa.uint64(),
    "ts_ns": pa.int64(),
    "num_events": pa.int32(),
    "replayed": pa.bool_(),
}
EVENT_COLUMNS: dict[str, pa.DataType] = {
    "dp_rank": pa.int16(),
    "epoch": pa.int32(),
    "seq": pa.uint64(),
    "event_index": pa.int32(),
    "block_position": pa.int32(),
    "ts_ns": pa.int64(),
    "kind": pa.string(),
    "block_hash": pa.uint64(),
    "block_hash_bytes": pa.binary(),
    "parent_hash": pa.uint64(),
    "num_tokens": pa.int32(),
    "lora_name": pa.string(),
    "medium": pa.string(),
    "group_idx": pa.int32(),
    "num_extra_keys": pa.int32(),
}
GAP_COLUMNS: dict[str, pa.DataType] = {
    "endpoint": pa.string(),
    "dp_rank": pa.int16(),
    "epoch": pa.int32(),
    "first_seq": pa.uint64(),
    "last_seq": pa.uint64(),
    "num_batches": pa.uint64(),
    "reason": pa.string(),
    "detected_ns": pa.int64(),
}
_DESCRIPTION_COLUMNS: dict[str, pa.DataType] = {
    "dp_rank": pa.int16(),
    "epoch": pa.int32(),
    "seq": pa.uint64(),
    "ts_ns": pa.int64(),
    "parent_hash": pa.uint64(),
    "num_tokens": pa.int32(),
    "lora_name": pa.string(),
    "tokens_digest": pa.binary(),
    "token_ids": pa.list_(pa.int64()),
}
CONFLICT_COLUMNS: dict[str, pa.DataType] = {
    "block_hash": pa.uint64(),
    "block_hash_bytes": pa.binary(),
    "group_idx": pa.int32(),
    "differs": pa.list_(pa.string()),
    **{f"first_{name}": kind for name, kind in _DESCRIPTION_COLUMNS.items()},
    **{f"second_{name}": kind for name, kind in _DESCRIPTION_COLUMNS.items()},
}


def append_vllm_batches(
    store: RunStore,
    batches: Sequence[ReceivedBatch],
    gaps: Sequence[Gap],
    detector: HashConflictDetector,
) -> list[HashConflict]:
    """Store batches (in sequence order) and gaps; run the detector over the batches and
    store the conflicts it finds, which it also returns. One transaction per call."""
    conflicts = detector.observe(batches)
    tables = {
        "vllm_kv_batches": batches_table(batches),
        "vllm_kv_events": events_table(batches),
        "vllm_kv_gaps": gaps_table(gaps),
        "vllm_kv_conflicts": conflicts_table(conflicts),
    }
    store.insert(tables)
    return conflicts


def batches_table(batches: Sequence[ReceivedBatch]) -> pa.Table:
    """One row per batch: its stream, number, engine time, size, and how it arrived."""
    rows = [
        {
            "endpoint": received.endpoint,
            "dp_rank": received.batch.data_parallel_rank,
            "epoch": received.epoch,
            "seq": received.seq,
            "ts_ns": round(received.batch.ts * 1e9),
            "num_events": len(received.batch.events),
            "replayed": received.replayed,
        }
        for received in batches
    ]
    return pa.Table.from_pylist(rows, schema=pa.schema(BATCH_COLUMNS))


def events_table(batches: Sequence[ReceivedBatch]) -> pa.Table:
    """One row per block of each BlockStored / BlockRemoved, one per AllBlocksCleared."""
    columns: dict[str, list[Any]] = {name: [] for name in EVENT_COLUMNS}
    for received in batches:
        batch = received.batch
        ts_ns = round(batch.ts * 1e9)
        for event_index, event in enumerate(batch.events):
            count = _add_event(columns, event)
            columns["dp_rank"].extend([batch.data_parallel_rank] * count)
            columns["epoch"].extend([received.epoch] * count)
            columns["seq"].extend([received.seq] * count)
            columns["event_index"].extend([event_index] * count)
            columns["ts_ns"].extend([ts_ns] * count)
    return pa.table(
        {name: pa.array(values, type=EVENT_COLUMNS[name]) for name, values in columns.items()}
    )


def _add_event(
    columns: dict[str, list[Any]], event: BlockStored | BlockRemoved | AllBlocksCleared
) -> int:
    """Append one event's own columns (one entry per block); returns its number of rows."""
    if isinstance(event, AllBlocksCleared):
        for name in _BLOCK_COLUMNS:
            columns[name].append(None)
        columns["kind"].append("cleared")
        return 1
    hashes = event.block_hashes
    count = len(hashes)
    columns["block_position"].extend(range(count))
    columns["block_hash"].extend(map(hash64, hashes))
    columns["block_hash_bytes"].extend(
        block_hash if isinstance(block_hash, bytes) else None for block_hash in hashes
    )
    columns["medium"].extend([event.medium] * count)
    columns["group_idx"].extend([event.group_idx] * count)
    if isinstance(event, BlockRemoved):
        columns["kind"].extend(["removed"] * count)
        for name in _STORED_COLUMNS:
            columns[name].extend([None] * count)
        return count
    columns["kind"].extend(["stored"] * count)
    parents: list[WireBlockHash | None] = [event.parent_block_hash, *hashes[:-1]][:count]
    if not describes_each_block(event):
        parents = [None] * count  # which block follows which, the event does not say
    columns["parent_hash"].extend(None if parent is None else hash64(parent) for parent in parents)
    columns["num_tokens"].extend([event.block_size] * count)
    columns["lora_name"].extend([event.lora_name] * count)
    keys = (block_extra_keys(event, position) for position in range(count))
    columns["num_extra_keys"].extend(
        None if entry is None else num_extra_keys(entry) for entry in keys
    )
    return count


# Columns a block event fills, and those only a BlockStored fills.
_STORED_COLUMNS = ("parent_hash", "num_tokens", "lora_name", "num_extra_keys")
_BLOCK_COLUMNS = (
    "block_position",
    "block_hash",
    "block_hash_bytes",
    "medium",
    "group_idx",
    *_STORED_COLUMNS,
)


def _hash_columns(block_hash: WireBlockHash) -> dict[str, Any]:
    full = block_hash if isinstance(block_hash, bytes) else None
    return {"block_hash": hash64(block_hash), "block_hash_bytes": full}


def gaps_table(gaps: Sequence[Gap]) -> pa.Table:
    """One row per run of batches that never arrived."""
    rows = [
        {
            "endpoint": gap.endpoint,
            "dp_rank": gap.dp_rank,
            "epoch": gap.epoch,
            "first_seq": gap.first_seq,
            "last_seq": gap.last_seq,
            "num_batches": gap.num_batches,
            "reason": gap.reason,
            "detected_ns": gap.detected_ns,
        }
        for gap in gaps
    ]
    return pa.Table.from_pylist(rows, schema=pa.schema(GAP_COLUMNS))


def conflicts_table(conflicts: Sequence[HashConflict]) -> pa.Table:
    """One row per conflict, with both blocks' descriptions side by side."""
    rows = []
    for conflict in conflicts:
        row = {
            "group_idx": conflict.group_idx,
            "differs": list(conflict.differs),
            **_hash_columns(conflict.block_hash),
        }
        row.update(_description_columns("first", conflict.first))
        row.update(_description_columns("second", conflict.second))
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=pa.schema(CONFLICT_COLUMNS))


def _description_columns(prefix: str, description: BlockDescription) -> dict[str, Any]:
    parent = description.parent_hash
    values = {
        "dp_rank": description.dp_rank,
        "epoch": description.epoch,
        "seq": description.seq,
        "ts_ns": description.ts_ns,
        "parent_hash": None if parent is None else hash64(parent),
        "num_tokens": description.num_tokens,
        "lora_name": description.lora_name,
        "tokens_digest": description.tokens_digest,
        "token_ids": None if description.token_ids is None else list(description.token_ids),
    }
    return {f"{prefix}_{name}": value for name, value in values.items()}
