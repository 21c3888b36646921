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
    hash_width,
    num_blocks,
)

# Per-block list fields of block records -> the events column of each block's row.
_PER_BLOCK: dict[type, dict[str, str]] = {
    Hit: {"block_ids": "block_id", "block_hashes": "block_hash"},
    Allocate: {"block_ids": "block_id"},
    Store: {
        "block_ids": "block_id",
        "block_hashes": "block_hash",
        "extra_keys": "extra_keys",
        "token_fingerprints": "token_fingerprint",
    },
    Evict: {"block_ids": "block_id", "block_hashes": "block_hash", "kv_groups": "kv_group"},
    Free: {"block_ids": "block_id", "ref_cnts": "ref_cnt", "kv_groups": "kv_group"},
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
    "longest_group_hit_tokens": pa.int32(),
    "num_tier_hit_tokens": pa.int32(),
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
    "kv_group": pa.int16(),
    "token_fingerprint": pa.uint64(),
}
_TEXT = pa.dictionary(pa.int32(), pa.string())


# The run-file tables records are ingested into (the others are derived from them).
INGESTED_TABLES = ("events", "pool", "collisions", "request_tokens", "block_tokens")


@dataclass
class Batch:
    """One batch of records as Arrow tables, one per run-file table (absent when empty)."""

    events: pa.Table | None = None
    pool: pa.Table | None = None
    collisions: pa.Table | None = None
    request_tokens: pa.Table | None = None
    block_tokens: pa.Table | None = None

    def tables(self) -> Iterable[tuple[str, pa.Table]]:
        for name in INGESTED_TABLES:
            table = getattr(self, name)
            if table is not None and table.num_rows:
                yield name, table


def hash64(block_hashes: Sequence[bytes | None]) -> pa.Array:
    """vLLM's 64-bit form of block hashes: the low 64 bits, big-endian (None stays null)."""
    present = [block_hash for block_hash in block_hashes if block_hash is not None]
    lengths = set(map(len, present))
    if len(lengths) == 1 and min(lengths) >= 8:
        values = low_64_bits(b"".join(present), lengths.pop())
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


def low_64_bits(packed: bytes, width: int) -> np.ndarray:
    """The low 64 bits (big-endian) of each of the hashes packed at `width` bytes each, as
    unsigned integers."""
    raw = np.frombuffer(packed, dtype=np.uint8).reshape(-1, width)
    return raw[:, width - 8 :].copy().view(">u8").ravel().astype(np.uint64)


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
                "block_hash": _packed_hashes(stores),
                "token_ids": pa.array(
                    [tokens for record in stores for tokens in record.token_ids],
                    type=pa.list_(pa.int32()),
                ),
            }
        )
    return batch


def _events_table(records_by_type: dict[type[Event], list[Any]]) -> pa.Table:
    """One row per record, or per block of a block record; built column by column (no
    Python loop per block: a capture delivers millions of block rows a minute). Rows come
    kind by kind, each kind in record order: sorting the whole batch by (seq, pos) would
    cost more than converting it (readers order by seq where order matters)."""
    tables = [_kind_table(cls, records) for cls, records in records_by_type.items()]
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def _kind_table(cls: type[Event], records: list[Any]) -> pa.Table:
    """The events rows of records of one kind, with every events column (null if unused)."""
    per_block = _PER_BLOCK.get(cls, {})
    counts = np.array(
        [num_blocks(record) for record in records] if per_block else [1] * len(records),
        dtype=np.int64,
    )
    total = int(counts.sum())
    starts = np.cumsum(counts) - counts  # each record's first row
    of_record = np.repeat(np.arange(len(records)), counts)  # each row's record
    columns: dict[str, pa.Array] = {
        "kind": pa.DictionaryArray.from_arrays(
            pa.array(np.zeros(total, dtype=np.int32)), [KIND_BY_TYPE[cls]]
        ),
        "pos": pa.array(np.arange(total) - starts[of_record], type=pa.int32()),
    }
    for field in cls.__struct_fields__:
        if field in per_block:
            columns[per_block[field]] = _per_block_column(per_block[field], records, field)
        elif field in EVENT_COLUMNS:
            values = [getattr(record, field) for record in records]
            if values.count(None) == len(values):
                continue  # no tenant, no adapter, ...: left to the shared nulls below
            columns[field] = _per_row(
                values, EVENT_COLUMNS[field], of_record if per_block else None
            )
    if cls is Hit or cls is Store:
        first_positions = np.array([record.first_position for record in records], dtype=np.int64)
        columns["block_position"] = pa.array(
            np.arange(total) - starts[of_record] + first_positions[of_record], type=pa.int32()
        )
    if cls is Store:
        columns["parent_hash"] = _parent_hashes(records, columns["block_hash"], starts)
        block_sizes = np.array([record.block_size for record in records], dtype=np.int32)
        columns["num_tokens"] = pa.array(block_sizes[of_record], type=pa.int32())
    # The columns a kind leaves empty share one zeroed buffer (calloc'd: no page is touched
    # to make it); a column of nulls each would zero a kind's worth of memory per column.
    zeros = pa.py_buffer(bytes(8 * total + 8))
    return pa.table(
        {
            name: columns[name] if name in columns else _nulls(_arrow_type(name), total, zeros)
            for name in EVENT_COLUMNS
        }
    )


def _nulls(data_type: pa.DataType, length: int, zeros: pa.Buffer) -> pa.Array:
    """`length` nulls of `data_type`, every buffer of them in `zeros` (8 bytes a row)."""
    if pa.types.is_dictionary(data_type):
        indices = _nulls(data_type.index_type, length, zeros)
        return pa.DictionaryArray.from_arrays(indices, pa.array([], type=data_type.value_type))
    if pa.types.is_list(data_type):
        children = [pa.array([], type=data_type.value_type)]
        return pa.Array.from_buffers(
            data_type, length, [zeros, zeros], null_count=length, children=children
        )
    return pa.Array.from_buffers(data_type, length, [zeros, zeros], null_count=length)


def _arrow_type(column: str) -> pa.DataType:
    """Text columns go to DuckDB dictionary-encoded: a block record's request id, tenant,
    ... repeat on each of its blocks, and an index per row is all that repeats."""
    data_type = EVENT_COLUMNS[column]
    return _TEXT if data_type == pa.string() else data_type


def _per_row(values: list[Any], data_type: pa.DataType, of_record: np.ndarray | None) -> pa.Array:
    """Values of a record field, one per row: `of_record` says each row's record (None: a
    row per record)."""
    if data_type != pa.string():
        array = pa.array(values, type=data_type)
        if of_record is None:
            return array
        if array.null_count:
            return array.take(of_record)
        return pa.array(array.to_numpy()[of_record], type=data_type)
    dictionary = pa.array(values, type=pa.string())
    mask = None
    rows = np.arange(len(values)) if of_record is None else of_record
    if dictionary.null_count:  # a null is a null index (Arrow merges no null entries)
        mask = dictionary.is_null().to_numpy(zero_copy_only=False)[rows]
        dictionary = dictionary.fill_null("")
    indices = pa.array(rows, type=pa.int32(), mask=mask)
    return pa.DictionaryArray.from_arrays(indices, dictionary)


def _per_block_column(column: str, records: list[Any], field: str) -> pa.Array:
    """A block record's per-block column, over the records in order."""
    if column == "extra_keys":  # None for the whole record unless a key was mixed in
        entries: list[Any] = []
        for record in records:
            keys = record.extra_keys
            entries.extend(keys if keys is not None else [None] * num_blocks(record))
        return pa.array(entries, type=EVENT_COLUMNS[column])
    if column == "block_hash":
        return _packed_hashes(records)
    if column == "token_fingerprint":
        return _token_fingerprints(records)
    # Every packed column is the hooks' but `kv_groups` and a dense layout's `ref_cnts`, which
    # the collector's mirror fills (collector/store/cache_mirror.py): a record it did not
    # complete is of group 0 (and counts 0).
    packed = b"".join(getattr(record, field) or bytes(len(record.block_ids)) for record in records)
    return pa.array(np.frombuffer(packed, dtype="<i4"), type=EVENT_COLUMNS[column])


def _packed_hashes(records: list[Any]) -> pa.Array:
    """The low 64 bits of every block hash of the records, in order."""
    widths = {hash_width(record) for record in records if record.block_ids}
    if len(widths) > 1:  # engines hashing at different widths: one record at a time
        return pa.concat_arrays([_packed_hashes([record]) for record in records])
    packed = b"".join(record.block_hashes for record in records)
    return pa.array(low_64_bits(packed, widths.pop() if widths else 8), type=pa.uint64())


def _token_fingerprints(records: list[Store]) -> pa.Array:
    """The key-free fingerprint of every stored block of the records, in order (null for the
    blocks of a record sent without them): 8 bytes a block, as checked on arrival
    (collector/live/batch_check.py), read as the hashes are."""
    packed = [record.token_fingerprints or bytes(len(record.block_ids) * 2) for record in records]
    values = low_64_bits(b"".join(packed), 8)
    if all(record.token_fingerprints is not None for record in records):
        return pa.array(values, type=pa.uint64())
    mask = np.repeat(
        [record.token_fingerprints is None for record in records],
        [num_blocks(record) for record in records],
    )
    return pa.array(values, type=pa.uint64(), mask=mask)


def _parent_hashes(records: list[Store], block_hashes: pa.Array, starts: np.ndarray) -> pa.Array:
    """Each stored block's parent: the block before it, or the record's parent for its first."""
    values = np.empty(len(block_hashes), dtype=np.uint64)
    values[1:] = block_hashes.to_numpy()[:-1]
    parents = hash64([record.parent_block_hash for record in records])
    values[starts] = parents.fill_null(0).to_numpy()
    mask = np.zeros(len(block_hashes), dtype=bool)
    mask[starts] = parents.is_null().to_numpy(zero_copy_only=False)
    return pa.array(values, type=pa.uint64(), mask=mask)


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
