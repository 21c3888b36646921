"""Hooks on one live vLLM v1 `KVCacheManager` and its `BlockPool`, recording block events.

`KVCacheHooks.attach()` shadows a few bound methods with instance attributes that call the
original first and then record what happened; vLLM's files and classes are untouched, and
`detach()` deletes the instance attributes so attribute lookup reaches the class again.

What the hooks keep for themselves (`CacheShadow`, never read back by vLLM): the hash each
cached block was stored under. This shadow mirrors vLLM's own `block.block_hash` exactly,
because every place that sets or clears a hash in a one-group full-attention pool goes
through a hooked method:
  set:    `cache_full_blocks`
  clear:  `get_new_blocks` (eviction on reuse), `evict_blocks`, `reset_prefix_cache`.

The hooks record block records without tenant or LoRA; those sit on the request records
(`Arrive`, `Lookup`) and a block record reaches them through `request_id`.

With `check_collisions`, the hooks also keep an independent fingerprint of every cached
block (`fingerprint.py`) and compare it with the requesting prompt's own on every prefix hit:
a mismatch is a `Collision` record naming both requests.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from itertools import compress
from operator import attrgetter
from typing import Any

from engine_hooks.block_content import block_token_ids, extra_key_kinds
from engine_hooks.buffer import EventBuffer
from engine_hooks.events import (
    Allocate,
    Arrive,
    Collision,
    Event,
    Evict,
    Finish,
    Free,
    Hit,
    Lookup,
    Pool,
    Preempt,
    Reset,
    Schedule,
    Store,
)
from engine_hooks.fingerprint import BlockFingerprints
from engine_hooks.layout import check_layout
from engine_hooks.privacy import Pseudonymizer
from engine_hooks.shadow import CacheShadow

Clock = Callable[[], int]

_BLOCK_ID = attrgetter("block_id")
_REF_CNT = attrgetter("ref_cnt")
_IS_ZERO = (0).__eq__

_MANAGER_METHODS = ("allocate_slots", "free", "record_prefix_cache_stats")
_POOL_METHODS = (
    "get_new_blocks",
    "touch",
    "cache_full_blocks",
    "free_blocks",
    "evict_blocks",
    "reset_prefix_cache",
)


class KVCacheHooks:
    """Records every block event of one `KVCacheManager` into an `EventBuffer`."""

    def __init__(
        self,
        manager: Any,
        buffer: EventBuffer,
        *,
        pseudonymizer: Pseudonymizer,
        clock: Clock = time.monotonic_ns,
        engine_id: str = "",
        dp_rank: int = 0,
        record_token_ids: bool = False,
        check_collisions: bool = False,
    ) -> None:
        check_layout(manager)
        self._manager = manager
        self._pool = manager.block_pool
        self._buffer = buffer
        self._pseudonymizer = pseudonymizer
        self._clock = clock
        self.engine_id = engine_id
        self.dp_rank = dp_rank
        self.record_token_ids = record_token_ids
        self.block_size: int = manager.kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
        self._shadow = CacheShadow()
        self._fingerprints = BlockFingerprints(self.block_size) if check_collisions else None
        self.num_hits_checked = 0
        self._request: Any = None
        self._seq = 0
        self.num_lost = 0
        self._attached: list[tuple[Any, str]] = []

    # -- attach / detach ---------------------------------------------------------------

    def attach(self) -> KVCacheHooks:
        """Install the hooks on the manager and its pool; returns self."""
        if self._attached:
            raise RuntimeError("hooks are already attached")
        for name in _MANAGER_METHODS + _POOL_METHODS:
            target = self._manager if name in _MANAGER_METHODS else self._pool
            method = getattr(target, name)
            # Never touch `vars(target)`: CPython would build the instance's `__dict__` for
            # it, and every attribute vLLM reads on that object would get slower for good.
            if getattr(method, "__self__", None) is not target:
                self.detach()
                raise RuntimeError(f"{type(target).__name__}.{name} is already patched")
            wrapper = getattr(self, f"_make_{name}")(method)
            setattr(target, name, wrapper)
            self._attached.append((target, name))
        return self

    def detach(self) -> None:
        """Remove every hook; the manager and pool behave exactly as before attach."""
        for target, name in reversed(self._attached):
            delattr(target, name)
        self._attached.clear()

    @property
    def attached(self) -> bool:
        return bool(self._attached)

    # -- records the caller reports ---------------------------------------------------

    def on_arrive(self, request: Any, tenant: str | None = None) -> None:
        """Record a request reaching the engine, with what the engine knows of it."""
        lora = request.lora_request.lora_name if request.lora_request else None
        lora = self._pseudonymizer.lora(lora)
        token_ids = list(request.prompt_token_ids) if self.record_token_ids else None
        record = Arrive(
            self._next_seq(),
            self._clock(),
            request.request_id,
            request.num_prompt_tokens,
            self._pseudonymizer.salt(request.cache_salt),
            token_ids,
            tenant=self._pseudonymizer.tenant(tenant),
            lora=lora,
            engine_id=self.engine_id,
            dp_rank=self.dp_rank,
        )
        self._emit([record])

    def on_schedule(self, request: Any) -> None:
        self._emit([Schedule(self._next_seq(), self._clock(), request.request_id)])

    def on_preempt(self, request: Any) -> None:
        self._emit([Preempt(self._next_seq(), self._clock(), request.request_id)])

    def on_finish(self, request: Any) -> None:
        record = Finish(
            self._next_seq(), self._clock(), request.request_id, request.num_output_tokens
        )
        self._emit([record])

    def record_pool_state(self) -> None:
        """Record free, cached-but-free and in-use blocks (call after each scheduler step)."""
        num_free = self._pool.get_num_free_blocks()
        num_usable = self._pool.num_gpu_blocks - 1  # the null block is never handed out
        record = Pool(
            self._next_seq(),
            self._clock(),
            None,
            num_free,
            self._shadow.num_cached_free,
            num_usable - num_free,
        )
        self._emit([record])

    @property
    def num_cached_blocks(self) -> int:
        """Blocks holding a prefix-cache hash right now, as the hooks saw them stored."""
        return len(self._shadow)

    # -- plumbing ----------------------------------------------------------------------

    def _next_seq(self) -> int:
        seq = self._seq
        self._seq = seq + 1
        return seq

    @property
    def num_records(self) -> int:
        """Records numbered so far: the next record's `seq`."""
        return self._seq

    def _emit(self, records: list[Event]) -> None:
        # A refused batch leaves a gap in `seq`; whoever stores the stream records the gap
        # as a `Drop` (the hooks cannot: the buffer that would carry it is full).
        if records and not self._buffer.offer(records):
            self.num_lost += len(records)

    # -- manager wrappers --------------------------------------------------------------

    def _make_allocate_slots(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def allocate_slots(request: Any, *args: Any, **kwargs: Any) -> Any:
            self._request = request
            try:
                return original(request, *args, **kwargs)
            finally:
                self._request = None

        return allocate_slots

    def _make_free(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def free(request: Any) -> None:
            self._request = request
            try:
                original(request)
            finally:
                self._request = None
                if self._fingerprints:
                    self._fingerprints.forget(request.request_id)

        return free

    def _make_record_prefix_cache_stats(self, original: Callable[..., Any]) -> Callable[..., Any]:
        manager = self._manager

        def record_prefix_cache_stats(request: Any, num_hits: int) -> None:
            original(request, num_hits)
            if not manager.prefix_cache_lookup_enabled(request):
                return
            lora = request.lora_request.lora_name if request.lora_request else None
            lora = self._pseudonymizer.lora(lora)
            record = Lookup(
                self._next_seq(),
                self._clock(),
                request.request_id,
                request.num_tokens,
                num_hits,
                num_hits // self.block_size,
                request.num_preemptions > 0,
                lora=lora,
                engine_id=self.engine_id,
                dp_rank=self.dp_rank,
            )
            self._emit([record])

        return record_prefix_cache_stats

    # -- pool wrappers -----------------------------------------------------------------

    def _request_id(self) -> str | None:
        request = self._request
        return None if request is None else str(request.request_id)

    def _make_get_new_blocks(self, original: Callable[..., Any]) -> Callable[..., Any]:
        shadow = self._shadow

        def get_new_blocks(num_blocks: int) -> Any:
            blocks = original(num_blocks)
            now = self._clock()
            request_id = self._request_id()
            block_ids = list(map(_BLOCK_ID, blocks))
            records: list[Event] = []
            evicted = shadow.cached_among(block_ids)
            if evicted:
                # vLLM dropped the hash of each cached free block it handed out.
                records.append(self._evict_record(now, request_id, evicted))
                shadow.num_cached_free -= len(evicted)
            records.append(Allocate(self._next_seq(), now, request_id, block_ids))
            self._emit(records)
            return blocks

        return get_new_blocks

    def _evict_record(self, now: int, request_id: str | None, block_ids: list[int]) -> Evict:
        """Build the record for blocks whose hashes vLLM just dropped; forget those hashes."""
        hashes = self._shadow.forget(block_ids)
        return Evict(self._next_seq(), now, request_id, block_ids, hashes)

    def _make_touch(self, original: Callable[..., Any]) -> Callable[..., Any]:
        shadow = self._shadow

        def touch(blocks: Sequence[Any]) -> None:
            original(blocks)
            if not blocks:
                return
            # One full-attention group (see layout.py): a prefix hit holds no null block.
            block_ids = list(map(_BLOCK_ID, blocks))
            hashes = shadow.hashes_of(block_ids)
            # A hit block with one reference now was free (and evictable) before.
            shadow.num_cached_free -= list(map(_REF_CNT, blocks)).count(1)
            now = self._clock()
            request_id = self._request_id()
            records: list[Event] = [Hit(self._next_seq(), now, request_id, block_ids, hashes)]
            if self._fingerprints and self._request is not None:
                records += self._check_hits(now, block_ids, hashes)
            self._emit(records)

        return touch

    def _check_hits(self, now: int, block_ids: list[int], hashes: list[bytes]) -> list[Event]:
        """Compare each hit block's stored fingerprint with the request's own (positions 0..)."""
        assert self._fingerprints is not None
        request = self._request
        expected = self._fingerprints.chain(request, len(block_ids))
        self.num_hits_checked += len(block_ids)
        collisions: list[Event] = []
        for position, block_id in enumerate(block_ids):
            stored, stored_by = self._shadow.stored_fingerprint(block_id)
            if stored is None or stored == expected[position]:
                continue
            collisions.append(
                Collision(
                    self._next_seq(),
                    now,
                    request.request_id,
                    block_id,
                    hashes[position],
                    stored_by,
                    stored,
                    expected[position],
                )
            )
        return collisions

    def _make_cache_full_blocks(self, original: Callable[..., Any]) -> Callable[..., Any]:
        shadow = self._shadow

        def cache_full_blocks(  # noqa: PLR0917 - vLLM's own signature
            request: Any,
            blocks: list[Any],
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
            # One full-attention group hashed at its block size (see layout.py): vLLM
            # stores every block of the range; full attention never masks one out.
            positions = range(num_cached_blocks, num_full_blocks)
            block_ids = list(map(_BLOCK_ID, blocks[num_cached_blocks:num_full_blocks]))
            request_hashes = request.block_hashes
            hashes = request_hashes[num_cached_blocks:num_full_blocks]
            now = self._clock()
            shadow.store(block_ids, hashes)
            if self._fingerprints:
                chain = self._fingerprints.chain(request, positions[-1] + 1)
                shadow.fingerprint(block_ids, map(chain.__getitem__, positions), request.request_id)
            first = positions[0]
            record = Store(
                self._next_seq(),
                now,
                request.request_id,
                block_ids,
                hashes,
                request_hashes[first - 1] if first else None,
                first,
                block_size,
                extra_key_kinds(request, positions),
                block_token_ids(request, positions, block_size) if self.record_token_ids else None,
            )
            self._emit([record])

        return cache_full_blocks

    def _make_free_blocks(self, original: Callable[..., Any]) -> Callable[..., Any]:
        shadow = self._shadow

        def free_blocks(ordered_blocks: Iterable[Any]) -> None:
            blocks = list(ordered_blocks)
            original(blocks)
            if not blocks:
                return  # one full-attention group (see layout.py): no null blocks
            block_ids = list(map(_BLOCK_ID, blocks))
            ref_cnts = list(map(_REF_CNT, blocks))
            back_in_queue = compress(block_ids, map(_IS_ZERO, ref_cnts))
            shadow.num_cached_free += shadow.count_cached(back_in_queue)
            record = Free(self._next_seq(), self._clock(), self._request_id(), block_ids, ref_cnts)
            self._emit([record])

        return free_blocks

    def _make_evict_blocks(self, original: Callable[..., Any]) -> Callable[..., Any]:
        shadow = self._shadow
        pool_blocks = self._pool.blocks

        def evict_blocks(block_ids: set[int]) -> None:
            original(block_ids)
            evicted = [
                block_id
                for block_id in sorted(block_ids)
                if block_id in shadow.hashes and pool_blocks[block_id].block_hash is None
            ]
            if not evicted:
                return
            shadow.num_cached_free -= sum(
                1 for block_id in evicted if pool_blocks[block_id].ref_cnt == 0
            )
            self._emit([self._evict_record(self._clock(), None, evicted)])

        return evict_blocks

    def _make_reset_prefix_cache(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def reset_prefix_cache() -> bool:
            done: bool = original()
            if done:
                num_cleared = self._shadow.clear()
                self._emit([Reset(self._next_seq(), self._clock(), None, num_cleared)])
            return done

        return reset_prefix_cache
