"""Finds two different blocks published under one block hash in vLLM's KV events.

By default vLLM publishes only the low 64 bits of each block hash. Every consumer that keys
on them (a KV-aware router, an external cache index, kvscope) then treats two blocks whose
hashes agree in those bits as one, although vLLM itself keeps them apart by the full hash.
BlockStored carries what the hash was computed from (parent hash, token ids, extra keys), so
a consumer can check: the same hash with another parent, other tokens or other keys is a
conflict. With vLLM's sha256 the chance is about n^2 / 2^65 for n distinct blocks.

What the detector remembers: each (KV cache group, medium, hash) from its BlockStored until
every DP rank that stored it there has removed it (BlockRemoved), cleared its cache
(AllBlocksCleared: the GPU pool only) or restarted. That is the window in which a consumer's
index maps the hash to that block. It keeps a 16-byte digest of the tokens, not the tokens
(unless asked to): about 430 bytes per cached block, some 5 us per stored block, for at most
MAX_TRACKED_BLOCKS blocks at once (some 450 MB, whatever a publisher claims is cached; past
it, a newly stored block goes unchecked, counted, until removals make room). A hash that
one rank caches twice at once in one medium (two requests computing the same prefix together;
two offloaded chunks that share a block) is forgotten at its first removal.

Each medium is checked apart. vLLM's offloading connector describes a block it copied to an
offload tier ("CPU", "STORAGE") less fully than the GPU pool did: without extra keys (vLLM
defers them), and by default as a placeholder (the chunk's last hash, no tokens, block size
0). Compared with the GPU pool's description of the same block, either would be a conflict
that is not there. Placeholders describe no block, so they are not checked at all.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from collector.vllm_kv.wire import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ReceivedBatch,
    WireBlockHash,
    block_extra_keys,
    describes_each_block,
    hash64,
)

_ENCODER = msgspec.msgpack.Encoder()
# Cached blocks remembered at once (about 450 MB): a GPU pool of a million blocks, or pools
# and tiers together of as many (vLLM's GPU pools hold tens of thousands).
MAX_TRACKED_BLOCKS = 1 << 20

logger = logging.getLogger("kvscope.collect")


def _digest(value: object) -> bytes:
    return hashlib.blake2b(_ENCODER.encode(value), digest_size=16).digest()


class BlockDescription(msgspec.Struct, frozen=True, gc=False):
    """What one BlockStored says a block is, and where it came from."""

    parent_hash: WireBlockHash | None
    tokens_digest: bytes
    keys_digest: bytes | None  # extra keys and lookahead tokens; None when there are none
    num_tokens: int
    lora_name: str | None
    dp_rank: int | None
    epoch: int
    seq: int
    ts_ns: int
    token_ids: tuple[int, ...] | None

    def differences(self, other: BlockDescription) -> tuple[str, ...]:
        """Which parts of two descriptions disagree: parent, tokens, keys."""
        parts = (
            ("parent", self.parent_hash != other.parent_hash),
            ("tokens", self.tokens_digest != other.tokens_digest),
            (
                "keys",
                self.keys_digest != other.keys_digest or self.lora_name != other.lora_name,
            ),
        )
        return tuple(name for name, differs in parts if differs)


@dataclass(frozen=True, slots=True)
class HashConflict:
    """Two different blocks under one published hash, in one KV cache group."""

    block_hash: WireBlockHash
    group_idx: int | None
    differs: tuple[str, ...]
    first: BlockDescription
    second: BlockDescription


Signature = tuple[WireBlockHash | None, bytes, bytes | None, str | None]
Key = tuple[int | None, str, WireBlockHash]  # KV cache group, medium, hash
Holding = tuple[int | None, bool]  # a DP rank, and whether in its GPU pool


class _Entry(msgspec.Struct, gc=False):
    description: BlockDescription
    holders: tuple[int | None, ...]  # DP ranks; a tuple, not a set: one is the rule
    reported: set[Signature] | None = None


class HashConflictDetector:
    """Watches BlockStored / BlockRemoved / AllBlocksCleared, in order, for hash conflicts.

    `record_token_ids` keeps each cached block's token ids so a conflict names them (private:
    off by default; conflicts then carry digests only).
    """

    def __init__(
        self, record_token_ids: bool = False, max_tracked: int = MAX_TRACKED_BLOCKS
    ) -> None:
        self.record_token_ids = record_token_ids
        self.max_tracked = max_tracked
        self.num_blocks_checked = 0
        self.num_blocks_unchecked = 0  # stored by events that do not describe each block
        self.num_blocks_untracked = 0  # stored while max_tracked blocks were remembered
        self._entries: dict[Key, _Entry] = {}
        # The keys each rank holds, GPU pool and tiers apart: a cache clear or a restart costs
        # what it forgets, not every block remembered (a publisher could otherwise send a
        # batch of 2^18 clears against a million blocks: hours).
        self._held: dict[Holding, set[Key]] = {}
        self._epochs: dict[int | None, int] = {}

    @property
    def num_tracked(self) -> int:
        """(Group, medium, hash) entries remembered now: cached, as far as the events tell."""
        return len(self._entries)

    def observe(self, batches: Sequence[ReceivedBatch]) -> list[HashConflict]:
        """Feed batches in sequence order; returns the conflicts they reveal."""
        conflicts: list[HashConflict] = []
        for received in batches:
            batch = received.batch
            if received.epoch != self._epochs.setdefault(batch.data_parallel_rank, received.epoch):
                # A restarted engine starts with an empty cache, and says nothing about it.
                self._epochs[batch.data_parallel_rank] = received.epoch
                self._on_cleared(batch.data_parallel_rank, every_medium=True)
            ts_ns = round(batch.ts * 1e9)
            for event in batch.events:
                if isinstance(event, BlockStored):
                    conflicts.extend(self._on_stored(received, event, ts_ns))
                elif isinstance(event, BlockRemoved):
                    self._on_removed(batch.data_parallel_rank, event)
                elif isinstance(event, AllBlocksCleared):
                    self._on_cleared(batch.data_parallel_rank, every_medium=False)
        return conflicts

    def _on_stored(
        self, received: ReceivedBatch, event: BlockStored, ts_ns: int
    ) -> list[HashConflict]:
        conflicts: list[HashConflict] = []
        if not event.token_ids or not describes_each_block(event):  # a placeholder, a window
            self.num_blocks_unchecked += len(event.block_hashes)
            return conflicts
        holder = received.batch.data_parallel_rank
        for position, block_hash in enumerate(event.block_hashes):
            description = self._describe(received, event, position, ts_ns)
            key = (event.group_idx, _medium(event.medium), _key_hash(block_hash))
            self.num_blocks_checked += 1
            entry = self._entries.get(key)
            if entry is None:
                self._remember(key, _Entry(description, (holder,)))
                continue
            if holder not in entry.holders:
                entry.holders = (*entry.holders, holder)
                self._held.setdefault(_holding(holder, key), set()).add(key)
            differs = entry.description.differences(description)
            signature = (
                description.parent_hash,
                description.tokens_digest,
                description.keys_digest,
                description.lora_name,
            )
            if differs and signature not in (entry.reported or ()):
                entry.reported = (entry.reported or set()) | {signature}
                conflicts.append(
                    HashConflict(
                        block_hash, event.group_idx, differs, entry.description, description
                    )
                )
        return conflicts

    def _remember(self, key: Key, entry: _Entry) -> None:
        """Track a newly cached block, unless max_tracked are tracked already (then it is
        counted, and said once)."""
        if len(self._entries) < self.max_tracked:
            self._entries[key] = entry
            self._held.setdefault(_holding(entry.holders[0], key), set()).add(key)
            return
        if not self.num_blocks_untracked:
            logger.warning(
                "kvscope collect: %s cached blocks remembered, kvscope's limit: blocks stored "
                "beyond it are not checked for hash conflicts until some are removed",
                f"{self.max_tracked:,}",
            )
        self.num_blocks_untracked += 1

    def _describe(
        self, received: ReceivedBatch, event: BlockStored, position: int, ts_ns: int
    ) -> BlockDescription:
        size = event.block_size
        tokens = event.token_ids[position * size : (position + 1) * size]
        parent = event.parent_block_hash if position == 0 else event.block_hashes[position - 1]
        extra_keys = block_extra_keys(event, position)  # encoded: digested as it came
        lookahead = event.lookahead_token_ids[position] if event.lookahead_token_ids else None
        return BlockDescription(
            parent_hash=None if parent is None else _key_hash(parent),
            tokens_digest=_digest(tokens),
            keys_digest=None
            if extra_keys is None and lookahead is None
            else _digest((extra_keys, lookahead)),
            num_tokens=len(tokens),
            lora_name=event.lora_name,
            dp_rank=received.batch.data_parallel_rank,
            epoch=received.epoch,
            seq=received.seq,
            ts_ns=ts_ns,
            token_ids=tuple(tokens) if self.record_token_ids else None,
        )

    def _on_removed(self, dp_rank: int | None, event: BlockRemoved) -> None:
        medium = _medium(event.medium)
        held = self._held.get((dp_rank, medium == MEDIUM_GPU))
        for block_hash in event.block_hashes:
            key = (event.group_idx, medium, _key_hash(block_hash))
            if held is not None and key in held:
                held.discard(key)
                self._release(key, dp_rank)

    def _on_cleared(self, dp_rank: int | None, every_medium: bool) -> None:
        """A rank's GPU pool was reset (its offload tiers too when `every_medium`: a restart)."""
        for in_gpu_pool in (True, False) if every_medium else (True,):
            for key in self._held.pop((dp_rank, in_gpu_pool), ()):
                self._release(key, dp_rank)

    def _release(self, key: Key, dp_rank: int | None) -> None:
        """`dp_rank` no longer holds `key`; forget the block once no rank does."""
        entry = self._entries[key]
        entry.holders = tuple(holder for holder in entry.holders if holder != dp_rank)
        if not entry.holders:
            del self._entries[key]


def _holding(dp_rank: int | None, key: Key) -> Holding:
    return dp_rank, key[1] == MEDIUM_GPU


def _medium(medium: str | None) -> str:
    """Where a block is held; vLLMs that send no medium have only the GPU pool."""
    return MEDIUM_GPU if medium is None else medium


def _key_hash(block_hash: WireBlockHash) -> WireBlockHash:
    """Ints as vLLM's 64-bit form; full hash bytes stay whole (no 64-bit risk there)."""
    return block_hash if isinstance(block_hash, bytes) else hash64(block_hash)
