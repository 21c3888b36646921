"""vLLM's own KV events as the witness of the hooks' records: both as (group, block hash)
pairs, in order, the hash in vLLM's 64-bit form (an int)."""

from __future__ import annotations

from typing import Any

from engine_hooks.events import Evict, Store, unpack_counts, unpack_hashes

Blocks = list[tuple[int, int]]


def ints(hashes: list[bytes]) -> list[int]:
    return [int.from_bytes(block_hash, "big") for block_hash in hashes]


def vllm_blocks(events: list[Any], kind: str) -> Blocks:
    """The blocks of vLLM's `BlockStored` or `BlockRemoved` events."""
    return [
        (event.group_idx, block_hash)
        for event in events
        if type(event).__name__ == kind
        for block_hash in event.block_hashes
    ]


def stored_blocks(records: list[Any]) -> Blocks:
    """The blocks of the `Store` records (vLLM publishes one event per call; the hooks may
    split a call into runs of positions: the same blocks, in the same order)."""
    return [
        (record.kv_group, block_hash)
        for record in records
        if isinstance(record, Store)
        for block_hash in ints(unpack_hashes(record))
    ]


def evicted_blocks(completed: list[Any]) -> Blocks:
    """The blocks of the `Evict` records, completed by the collector's mirror (the groups)."""
    return [
        (group, block_hash)
        for record in completed
        if isinstance(record, Evict)
        for group, block_hash in zip(
            unpack_counts(record.kv_groups or b""), ints(unpack_hashes(record)), strict=True
        )
    ]
