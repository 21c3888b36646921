"""The half of the hooks that sits on vLLM's `BlockPool`: block allocation, prefix hits,
stores, frees, evictions and cache resets, each recorded after vLLM's own method ran (see
hooks.py for the whole design; recorder.py numbers and buffers the records of both halves,
and says what both do when their own code fails)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

from engine_hooks.block_content import block_token_ids, extra_key_kinds
from engine_hooks.buffer import EventBuffer
from engine_hooks.events import (
    GROUP_ID_BYTES,
    Allocate,
    Collision,
    Event,
    Evict,
    Free,
    Hit,
    Reset,
    Store,
    pack_cache_keys,
    pack_counts,
    pack_hashes,
)
from engine_hooks.fingerprint import BlockFingerprints
from engine_hooks.layout import CacheLayout
from engine_hooks.recorder import Clock, Recorder

if TYPE_CHECKING:  # vLLM's own types; the hooks import nothing from vLLM at run time
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import KVCacheBlock
    from vllm.v1.request import Request

POOL_METHODS = (
    "get_new_blocks",
    "touch",
    "cache_full_blocks",
    "cache_partial_block",
    "free_blocks",
    "evict_blocks",
    "reset_prefix_cache",
)


class PoolHooks(Recorder):
    """Records the block events of one `BlockPool` into an `EventBuffer`; the request that
    caused them is the one the manager half set in `_request`, and in a layout of several
    groups (or of one that is not full attention) the group is the one it set in `_group`.

    A dense layout (one full-attention group, `CacheLayout.dense`) gets the fast wrappers;
    any other gets the sparse ones, which skip vLLM's null blocks, store only the blocks
    vLLM stores, and say where a group's hit starts (`_hit_length`: the blocks of the hit
    vLLM found for the group, nulls included, set by the manager half)."""

    def __init__(
        self,
        pool: BlockPool,
        buffer: EventBuffer,
        *,
        clock: Clock,
        layout: CacheLayout,
        record_token_ids: bool,
        check_collisions: bool,
        fingerprint_key: bytes,
    ) -> None:
        super().__init__(buffer, clock)
        self._pool = pool
        self.layout = layout
        self.block_size = layout.block_size
        self.record_token_ids = record_token_ids
        self._fingerprints = (
            BlockFingerprints(self.block_size, fingerprint_key) if check_collisions else None
        )
        self._request: Request | None = None
        self._group = 0
        self._hit_length = 0

    # -- pool wrappers -----------------------------------------------------------------

    def _request_id(self) -> str | None:
        request = self._request
        return None if request is None else str(request.request_id)

    def _make_get_new_blocks(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def get_new_blocks(num_blocks: int, *args: Any, **kwargs: Any) -> list[KVCacheBlock]:
            blocks: list[KVCacheBlock] = original(num_blocks, *args, **kwargs)
            try:
                self._record_allocate(blocks)
            except Exception as error:
                self.failed(error, "BlockPool.get_new_blocks")
            return blocks

        return get_new_blocks

    def _record_allocate(self, blocks: list[KVCacheBlock]) -> None:
        block_ids = [block.block_id for block in blocks]
        record = Allocate(
            self._next_seq(),
            self._clock(),
            self._request_id(),
            pack_counts(block_ids),
            self._group,
        )
        self._emit([record])

    def _make_touch(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def touch(blocks: Sequence[KVCacheBlock], *args: Any, **kwargs: Any) -> None:
            original(blocks, *args, **kwargs)
            try:
                self._record_hit(blocks)
            except Exception as error:
                self.failed(error, "BlockPool.touch")

        return touch

    def _record_hit(self, blocks: Sequence[KVCacheBlock]) -> None:
        first = 0
        if not self.layout.dense:  # a window's hit: vLLM's null blocks, then the ones reused
            blocks = [block for block in blocks if not block.is_null]
            first = max(self._hit_length - len(blocks), 0)
        if not blocks:
            return
        block_ids = [block.block_id for block in blocks]
        keys = cast("list[bytes]", [block.block_hash for block in blocks])
        now = self._clock()
        hashes = pack_cache_keys(keys)
        records: list[Event] = [
            Hit(
                self._next_seq(),
                now,
                self._request_id(),
                pack_counts(block_ids),
                hashes,
                first,
                self._group,
            )
        ]
        if self._fingerprints and self._request is not None:
            records += self._check_hits(self._request, now, block_ids, keys, first=first)
        self._emit(records)

    def _check_hits(
        self, request: Request, now: int, block_ids: list[int], keys: list[bytes], *, first: int
    ) -> list[Event]:
        """Compare each hit block's stored fingerprint with the request's own (positions
        `first`..)."""
        assert self._fingerprints is not None
        mismatches = self._fingerprints.mismatches(request, block_ids, first)
        return [
            Collision(
                self._next_seq(),
                now,
                request.request_id,
                block_ids[index],
                keys[index][:-GROUP_ID_BYTES],
                stored_by,
                stored,
                expected,
            )
            for index, stored, stored_by, expected in mismatches
        ]

    def _make_cache_full_blocks(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def cache_full_blocks(  # noqa: PLR0917 - vLLM's own signature
            request: Request,
            blocks: list[KVCacheBlock],
            num_cached_blocks: int,
            num_full_blocks: int,
            block_size: int,
            kv_cache_group_id: int,
            block_mask: list[bool] | None = None,
        ) -> None:
            original(
                request=request,
                blocks=blocks,
                num_cached_blocks=num_cached_blocks,
                num_full_blocks=num_full_blocks,
                block_size=block_size,
                kv_cache_group_id=kv_cache_group_id,
                block_mask=block_mask,
            )
            if num_cached_blocks >= num_full_blocks:
                return
            try:
                self._record_stores(
                    request,
                    blocks,
                    num_cached_blocks,
                    num_full_blocks,
                    kv_cache_group_id,
                    block_mask,
                )
            except Exception as error:
                self.failed(error, "BlockPool.cache_full_blocks")

        return cache_full_blocks

    def _record_stores(  # noqa: PLR0917 - vLLM's arguments, passed on
        self,
        request: Request,
        blocks: list[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        group: int,
        block_mask: list[bool] | None,
    ) -> None:
        if self.layout.dense:  # vLLM stores every block of the range: none masked out
            self._store(request, blocks[num_cached_blocks:num_full_blocks], num_cached_blocks, 0)
            return
        # vLLM skips null blocks (left of a window) and the ones the mask leaves out
        # (which no later prefix could reach): one `Store` per run of stored positions.
        stored = [
            position
            for position in range(num_cached_blocks, num_full_blocks)
            if not blocks[position].is_null
            and (block_mask is None or block_mask[position - num_cached_blocks])
        ]
        start = 0
        for index in range(1, len(stored) + 1):
            if index == len(stored) or stored[index] != stored[index - 1] + 1:
                first = stored[start]
                end = first + index - start
                self._store(request, blocks[first:end], first, group)
                start = index

    def _store(
        self, request: Request, blocks: Sequence[KVCacheBlock], first: int, group: int
    ) -> None:
        """Record that vLLM stored these blocks as the request's, from position `first` on."""
        end = first + len(blocks)
        positions = range(first, end)
        block_ids = [block.block_id for block in blocks]
        request_hashes = cast("list[bytes]", request.block_hashes)  # BlockHash: NewType(bytes)
        token_fingerprints = None
        if self._fingerprints:
            collision, key_free = self._fingerprints.chains(request, end)
            self._fingerprints.store(block_ids, collision[first:end], request.request_id)
            token_fingerprints = pack_hashes(key_free[first:end])
        record = Store(
            self._next_seq(),
            self._clock(),
            request.request_id,
            pack_counts(block_ids),
            pack_hashes(request_hashes[first:end]),
            request_hashes[first - 1] if first else None,
            first,
            self.block_size,
            extra_key_kinds(request, positions),
            block_token_ids(request, positions, self.block_size) if self.record_token_ids else None,
            group,
            token_fingerprints,
        )
        self._emit([record])

    def _make_cache_partial_block(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """vLLM caching one block at a prefix boundary outside `cache_full_blocks` (a Mamba
        group's state block at the prompt's last boundary). In the layouts kvscope mirrors
        every group is hashed at its block size, so the boundary ends the block and the
        block's key is its position's hash: a one-block `Store`, after an `Evict` of the
        key it replaced, if any (layout.py refuses the layouts with partial-block keys)."""

        def cache_partial_block(
            request: Request,
            block: KVCacheBlock,
            num_tokens: int,
            kv_cache_group_id: int,
            *args: Any,
            **kwargs: Any,
        ) -> Any:
            before = block.block_hash
            key = original(request, block, num_tokens, kv_cache_group_id, *args, **kwargs)
            try:
                self._record_partial_store(request, block, before, num_tokens, kv_cache_group_id)
            except Exception as error:
                self.failed(error, "BlockPool.cache_partial_block")
            return key

        return cache_partial_block

    def _record_partial_store(
        self, request: Request, block: KVCacheBlock, before: Any, num_tokens: int, group: int
    ) -> None:
        after = block.block_hash
        if after == before or after is None:
            return
        if before is not None:
            self._evict([block.block_id], cast("list[bytes]", [before]))
        self._store(request, [block], num_tokens // self.block_size - 1, group)

    def _make_free_blocks(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def free_blocks(ordered_blocks: Iterable[KVCacheBlock], *args: Any, **kwargs: Any) -> None:
            # vLLM 0.34 adds `evict_first`: passed on as given (vllm_api.py).
            blocks = list(ordered_blocks)  # read twice: by vLLM, then by the record
            original(blocks, *args, **kwargs)
            try:
                self._record_free(blocks)
            except Exception as error:
                self.failed(error, "BlockPool.free_blocks")

        return free_blocks

    def _record_free(self, blocks: list[KVCacheBlock]) -> None:
        ref_cnts = None  # in a dense layout, the collector's to count (events.Free)
        if not self.layout.dense:  # vLLM skips null blocks (it never pools them)
            blocks = [block for block in blocks if not block.is_null]
            ref_cnts = pack_counts([block.ref_cnt for block in blocks])
        if not blocks:
            return
        record = Free(
            self._next_seq(),
            self._clock(),
            self._request_id(),
            pack_counts([block.block_id for block in blocks]),
            ref_cnts,
        )
        self._emit([record])

    def _make_evict_blocks(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def evict_blocks(block_ids: set[int], *args: Any, **kwargs: Any) -> None:
            # vLLM drops the hash of each cached block among `block_ids`: read them first.
            try:
                keys = self._cached_keys(block_ids)
            except Exception as error:
                self.failed(error, "BlockPool.evict_blocks")
                keys = {}
            original(block_ids, *args, **kwargs)
            try:
                self._record_evictions(keys)
            except Exception as error:
                self.failed(error, "BlockPool.evict_blocks")

        return evict_blocks

    def _cached_keys(self, block_ids: Iterable[int]) -> dict[int, Any]:
        pool_blocks = self._pool.blocks
        num_blocks = len(pool_blocks)
        return {
            block_id: pool_blocks[block_id].block_hash
            for block_id in block_ids
            if 0 <= block_id < num_blocks
        }

    def _record_evictions(self, keys: dict[int, Any]) -> None:
        pool_blocks = self._pool.blocks
        evicted = sorted(
            block_id
            for block_id, key in keys.items()
            if key is not None and pool_blocks[block_id].block_hash is None
        )
        if evicted:
            self._evict(evicted, cast("list[bytes]", [keys[block_id] for block_id in evicted]))

    def _evict(self, block_ids: list[int], keys: list[bytes]) -> None:
        """Record that vLLM dropped these blocks' keys from its prefix cache."""
        record = Evict(
            self._next_seq(), self._clock(), None, pack_counts(block_ids), pack_cache_keys(keys)
        )
        self._emit([record])

    def _make_reset_prefix_cache(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def reset_prefix_cache(*args: Any, **kwargs: Any) -> bool:
            done: bool = original(*args, **kwargs)
            if done:
                try:
                    self._record_reset()
                except Exception as error:
                    self.failed(error, "BlockPool.reset_prefix_cache")
            return done

        return reset_prefix_cache

    def _record_reset(self) -> None:
        if self._fingerprints:
            self._fingerprints.clear()
        self._emit([Reset(self._next_seq(), self._clock(), None, None)])
