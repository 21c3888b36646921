"""Turns batches of engine records into Arrow tables shaped like the run file's tables."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np
import pyarrow as pa

from engine_hooks.events import (
    KIND_BY_TYPE,
    Allocate,
    Arrive,
    Collision,
    Event,
    Evict,
    Free,
    Hit,
    Pool,
    Store,
)

# Per-block list fields of block records -> the events column of each block's row.
_PER_BLOCK: dict[type, dict[str, str]] = {
    Hit: {"block_ids": "block_id", "block_hashes": "block_hash"},
    Allocate: {"block_ids": "block_id"},
    Store: {"block_ids": "block_id", "block_hashes": "block_hash", "extra_keys": "extra_keys"},
    Evict: {"block_ids": "block_id", "block_hashes": "block_hash"},
    Free: {"block_ids": "block_id", "ref_cnts": "ref_cnt"},
}

EVENT_COLUMNS: dict[str, pa.DataType] = {
    "seq": pa.uint64(),
    "pos": pa.int32(),
    "ts_ns": pa.int64(),
    "kind": pa.string(),
    "request_id": pa.string(),
    "block_id": pa.int32(),
    "block_position": pa.int32(),
    "block_hash": pa.uint64(),
    "parent_hash": pa.uint64(),
    "num_tokens": pa.int32(),
    "num_prompt_tokens": pa.int32(),
    "num_hit_tokens": pa.int32(),
    "num_hit_blocks": pa.int32(),
    "preempted": pa.bool_(),
    "age_ns": pa.int64(),
    "num_hits": pa.int32(),
    "ref_cnt": pa.int32(),
    "num_output_tokens": pa.int32(),
    "num_lost": pa.int64(),
    "num_cleared": pa.int32(),
    "extra_keys": pa.list_(pa.string()),
    "salt_hash": pa.string(),
    "tenant": pa.string(),
    "lora": pa.string(),
    "engine_id": pa.string(),
    "dp_rank": pa.int16(),
}
_HASH_COLUMNS = {"block_hash", "parent_hash"}


@dataclass
class Batch:
    """One batch of records as Arrow tables, one per run-file table (absent when empty)."""

    events: pa.Table | None = None
    pool: pa.Table | None = None
    collisions: pa.Table | None = None
    request_tokens: pa.Table | None = None
    block_tokens: pa.Table | None = None

    def tables(self) -> Iterable[tuple[str, pa.Table]]:
        for name in ("events", "pool", "collisions", "request_tokens", "block_tokens"):
            table = getattr(self, name)
            if table is not None and table.num_rows:
                yield name, table


def hash64(block_hashes: Sequence[bytes | None]) -> pa.Array:
    """vLLM's 64-bit form of block hashes: the low 64 bits, big-endian (None stays null)."""
    present = [block_hash for block_hash in block_hashes if block_hash is not None]
    lengths = {len(block_hash) for block_hash in present}
    if len(lengths) == 1 and min(lengths) >= 8:
        width = lengths.pop()
        raw = np.frombuffer(b"".join(present), dtype=np.uint8).reshape(-1, width)
        values = raw[:, width - 8 :].copy().view(">u8").ravel().astype(np.uint64)
    else:
        values = np.array(
            [int.from_bytes(block_hash[-8:], "big") for block_hash in present], dtype=np.uint64
        )
    if len(present) == len(block_hashes):
        return pa.array(values, type=pa.uint64())
    mask = np.array([block_hash is None for block_hash in block_hashes])
    full = np.zeros(len(block_hashes), dtype=np.uint64)
    full[~mask] = values
    return pa.array(full, type=pa.uint64(), mask=mask)


def to_batch(records: Sequence[Event]) -> Batch:
    """Split records by kind into the run file's tables."""
    by_type: dict[type[Event], list[Any]] = defaultdict(list)
    for record in records:
        by_type[type(record)].append(record)
    batch = Batch()
    event_types = [cls for cls in by_type if cls not in (Pool, Collision)]
    if event_types:
        batch.events = _events_table({cls: by_type[cls] for cls in event_types})
    if Pool in by_type:
        batch.pool = _plain_table(
            by_type[Pool], Pool.__struct_fields__, drop={"request_id", "tenant", "lora"}
        )
    if Collision in by_type:
        batch.collisions = _collisions_table(by_type[Collision])
    arrivals = [record for record in by_type.get(Arrive, ()) if record.token_ids is not None]
    if arrivals:
        batch.request_tokens = pa.table(
            {
                "request_id": [record.request_id for record in arrivals],
                "token_ids": pa.array(
                    [record.token_ids for record in arrivals], type=pa.list_(pa.int32())
                ),
            }
        )
    stores = [record for record in by_type.get(Store, ()) if record.token_ids is not None]
    if stores:
        batch.block_tokens = pa.table(
            {
                "block_hash": hash64([h for record in stores for h in record.block_hashes]),
                "token_ids": pa.array(
                    [tokens for record in stores for tokens in record.token_ids],
                    type=pa.list_(pa.int32()),
                ),
            }
        )
    return batch


def _events_table(records_by_type: dict[type[Event], list[Any]]) -> pa.Table:
    columns: dict[str, list[Any]] = {name: [] for name in EVENT_COLUMNS}
    for cls, records in records_by_type.items():
        per_block = _PER_BLOCK.get(cls, {})
        counts = [len(record.block_ids) for record in records] if per_block else [1] * len(records)
        total = sum(counts)
        filled = {"kind", "pos"}
        columns["kind"].extend([KIND_BY_TYPE[cls]] * total)
        for count in counts:
            columns["pos"].extend(range(count))
        for field in cls.__struct_fields__:
            if field in per_block:
                values = columns[per_block[field]]
                for record, count in zip(records, counts, strict=True):
                    entries = getattr(record, field)
                    values.extend(entries if entries is not None else [None] * count)
                filled.add(per_block[field])
            elif field in columns:
                values = columns[field]
                for record, count in zip(records, counts, strict=True):
                    values.extend([getattr(record, field)] * count)
                filled.add(field)
        filled |= _derived_columns(cls, records, columns)
        for column, values in columns.items():
            if column not in filled:
                values.extend([None] * total)
    arrays = {
        name: hash64(values)
        if name in _HASH_COLUMNS
        else pa.array(values, type=EVENT_COLUMNS[name])
        for name, values in columns.items()
    }
    table = pa.table(arrays)
    order = pa.compute.sort_indices(table, sort_keys=[("seq", "ascending"), ("pos", "ascending")])
    return table.take(order)


def _derived_columns(cls: type, records: list[Any], columns: dict[str, list[Any]]) -> set[str]:
    """Columns a block record implies: each block's position and (for stores) its parent."""
    if cls is Hit:
        for record in records:
            columns["block_position"].extend(range(len(record.block_ids)))
        return {"block_position"}
    if cls is Store:
        for record in records:
            count = len(record.block_ids)
            first = record.first_position
            columns["block_position"].extend(range(first, first + count))
            columns["parent_hash"].append(record.parent_block_hash)
            columns["parent_hash"].extend(record.block_hashes[:-1])
            columns["num_tokens"].extend([record.block_size] * count)
        return {"block_position", "parent_hash", "num_tokens"}
    return set()


def _plain_table(records: list[Any], fields: Sequence[str], drop: set[str]) -> pa.Table:
    return pa.table(
        {field: list(map(attrgetter(field), records)) for field in fields if field not in drop}
    )


def _collisions_table(records: list[Collision]) -> pa.Table:
    return pa.table(
        {
            "seq": [record.seq for record in records],
            "ts_ns": [record.ts_ns for record in records],
            "request_id": [record.request_id for record in records],
            "stored_by": [record.stored_by for record in records],
            "block_id": [record.block_id for record in records],
            "block_hash": hash64([record.block_hash for record in records]),
            "stored_fingerprint": [record.stored_fingerprint for record in records],
            "request_fingerprint": [record.request_fingerprint for record in records],
            "engine_id": [record.engine_id for record in records],
            "dp_rank": [record.dp_rank for record in records],
        }
    )
