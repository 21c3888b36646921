"""vLLM's KV event wire format (vllm/distributed/kv_events.py), decoded without importing vLLM.

An unmodified `vllm serve --kv-events-config ...` publishes multipart ZMQ messages
`[topic, 8-byte big-endian sequence number, msgpack(KVEventBatch)]`. The structs below mirror
vLLM 0.33's `KVEventBatch`, `BlockStored`, `BlockRemoved` and `AllBlocksCleared` field for
field (tests/test_vllm_kv_wire.py checks it against vLLM's own classes). Fields that older
vLLM versions lack have defaults, and fields newer ones add are ignored, so the collector
decodes other versions too. Importing vLLM would load torch (seconds); this module does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

HASH64_MASK = (1 << 64) - 1

MEDIUM_GPU = "GPU"  # vLLM's name for the prefix cache's own pool (older vLLMs send no medium)

# Block hashes as vLLM publishes them: the low 64 bits as an int by default
# (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1), the full hash bytes when that is 0.
WireBlockHash = int | bytes


class BlockStored(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """Full blocks entered the prefix cache (or, in "full" report mode, were reused)."""

    block_hashes: list[WireBlockHash]
    parent_block_hash: WireBlockHash | None = None
    token_ids: list[int] = msgspec.field(default_factory=list)
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """Block hashes left the prefix cache (evicted, promoted, or reset one by one)."""

    block_hashes: list[WireBlockHash]
    medium: str | None = None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """The whole prefix cache was reset."""


WireEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One engine step's events: vLLM's wall-clock time (s), the events, its DP rank."""

    ts: float
    events: list[WireEvent]
    data_parallel_rank: int | None = None


_DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """Decode one message payload; raises msgspec.DecodeError on anything else."""
    return _DECODER.decode(payload)


def hash64(block_hash: WireBlockHash) -> int:
    """The 64-bit form of a published hash, as vLLM makes it: the low 64 bits, big-endian."""
    if isinstance(block_hash, bytes):
        return int.from_bytes(block_hash[-8:], "big")
    return block_hash & HASH64_MASK


@dataclass(frozen=True)
class ReceivedBatch:
    """A batch as the subscriber got it: which stream, its sequence number, live or replayed.

    `epoch` counts publisher restarts seen on this endpoint (vLLM's numbers restart at 0).
    """

    endpoint: str
    epoch: int
    seq: int
    batch: KVEventBatch
    replayed: bool


@dataclass(frozen=True)
class Gap:
    """Batches `first_seq`..`last_seq` (inclusive) that never arrived, and why."""

    endpoint: str
    epoch: int
    dp_rank: int | None
    first_seq: int
    last_seq: int
    reason: str
    detected_ns: int

    @property
    def num_batches(self) -> int:
        return self.last_seq - self.first_seq + 1


def describes_each_block(event: BlockStored) -> bool:
    """Whether a BlockStored's tokens are its blocks' own, block after block. A hybrid model's
    sliding-window group stores only the blocks its window can reuse: vLLM then publishes the
    hashes of those (none, at times) with the tokens of the whole range, so which tokens and
    which parent go with which hash, the event does not say."""
    return len(event.token_ids) == len(event.block_hashes) * event.block_size
