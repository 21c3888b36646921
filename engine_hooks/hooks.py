"""Hooks on one live vLLM v1 `KVCacheManager` and its `BlockPool`, recording block events.

`KVCacheHooks.attach()` shadows a few bound methods with instance attributes that call the
original first and then record what happened; vLLM's files and classes are untouched, and
`detach()` deletes the instance attributes so attribute lookup reaches the class again.

The hooks keep no per-block state of their own: each record says what vLLM just did to a
list of blocks, in the order it did it. Every place that sets or clears a block's hash in a
pool of the layouts kvscope mirrors (layout.py) goes through a hooked method:
  set:    `cache_full_blocks` (a `Store`), `cache_partial_block` (a one-block `Store`, after
          an `Evict` of the key it replaces: a Mamba group's state block)
  clear:  `get_new_blocks` (an `Allocate`: a cached block handed out again loses its hash),
          `evict_blocks` (an `Evict`), `reset_prefix_cache` (a `Reset`).
One exception, in Mamba groups: vLLM drops a transient prefill checkpoint with
`_maybe_evict_cached_block` (not hooked: `get_new_blocks` calls it for every block); it has
only been seen to do so on blocks not yet keyed (layout.py, `check_layout`).
So the stream alone says which blocks are cached, and which are free; the collector derives
from it the evictions on reuse and the cached-free counts (`collector/store/cache_mirror.py`).

The hooks record block records without tenant or LoRA; those sit on the request records
(`Arrive`, `Lookup`) and a block record reaches them through `request_id`.

In a layout of several KV cache groups (or of one sliding-window or chunked-local group),
the pool does not know which group calls it: the hooks also wrap each group's own manager
(`SingleTypeKVCacheManager`) where it allocates or reuses blocks, to name the group in the
records (`kv_group`). vLLM frees the blocks of every group of a request in one call; the
collector names the group of each freed or evicted block from its allocation.

With `check_collisions` (the fingerprints), the hooks do keep per-block state: an independent
fingerprint of every cached block (`fingerprint.py`), compared with the requesting prompt's
own on every prefix hit; a mismatch is a `Collision` record naming both requests. The same
pass gives each stored block its key-free fingerprint, sent with its `Store`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from engine_hooks.buffer import EventBuffer
from engine_hooks.events import (
    Arrive,
    Finish,
    FirstToken,
    Lookup,
    Pool,
    Preempt,
    Schedule,
)
from engine_hooks.fingerprint import KEY_BYTES
from engine_hooks.layout import CacheLayout, check_layout
from engine_hooks.pool_hooks import POOL_METHODS, PoolHooks
from engine_hooks.privacy import Pseudonymizer
from engine_hooks.recorder import Clock

if TYPE_CHECKING:  # vLLM's own types; the hooks import nothing from vLLM at run time
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.request import Request

MANAGER_METHODS = ("allocate_slots", "free", "record_prefix_cache_stats")
# Each group's own manager, in a layout that is not dense (see PoolHooks).
GROUP_METHODS = (
    "add_local_computed_blocks",
    "allocate_new_blocks",
    "allocate_external_computed_blocks",
)


class KVCacheHooks(PoolHooks):
    """Records every block event of one `KVCacheManager` into an `EventBuffer`."""

    def __init__(
        self,
        manager: KVCacheManager,
        buffer: EventBuffer,
        *,
        pseudonymizer: Pseudonymizer,
        clock: Clock = time.monotonic_ns,
        record_token_ids: bool = False,
        check_collisions: bool = False,
    ) -> None:
        layout: CacheLayout = check_layout(manager)
        super().__init__(
            manager.block_pool,
            buffer,
            clock=clock,
            layout=layout,
            record_token_ids=record_token_ids,
            check_collisions=check_collisions,
            fingerprint_key=pseudonymizer.key("token-fingerprint", KEY_BYTES),
        )
        self._manager = manager
        self._pseudonymizer = pseudonymizer
        self._tier_hit_tokens = 0  # of the last `allocate_slots` call

    # -- attach / detach ---------------------------------------------------------------

    def attach(self) -> KVCacheHooks:
        """Install the hooks on the manager and its pool; returns self."""
        if self._attached:
            raise RuntimeError("hooks are already attached")
        targets: list[tuple[Any, str, Callable[[Callable[..., Any]], Any]]] = [
            (
                self._manager if name in MANAGER_METHODS else self._pool,
                name,
                getattr(self, f"_make_{name}"),
            )
            for name in MANAGER_METHODS + POOL_METHODS
        ]
        if not self.layout.dense:
            for group, single in enumerate(self._manager.coordinator.single_type_managers):
                targets += [
                    (single, name, functools.partial(getattr(self, f"_make_{name}"), group=group))
                    for name in GROUP_METHODS
                ]
        for target, name, make in targets:
            method = getattr(target, name)
            # Never touch `vars(target)`: CPython would build the instance's `__dict__` for
            # it, and every attribute vLLM reads on that object would get slower for good.
            if getattr(method, "__self__", None) is not target:
                self.detach()
                raise RuntimeError(f"{type(target).__name__}.{name} is already patched")
            setattr(target, name, make(method))
            self._attached.append((target, name))
        return self

    # -- records the caller reports ---------------------------------------------------

    def on_arrive(self, request: Request, tenant: str | None = None) -> None:
        """Record a request reaching the engine, with what the engine knows of it."""
        lora = request.lora_request.lora_name if request.lora_request else None
        lora = self._pseudonymizer.lora(lora)
        prompt = request.prompt_token_ids  # None when the prompt came as embeddings
        token_ids = list(prompt) if self.record_token_ids and prompt is not None else None
        record = Arrive(
            self._next_seq(),
            self._clock(),
            request.request_id,
            request.num_prompt_tokens,
            self._pseudonymizer.salt(request.cache_salt),
            token_ids,
            tenant=self._pseudonymizer.tenant(tenant),
            lora=lora,
        )
        self._emit([record])

    def on_schedule(self, request: Request) -> None:
        self._emit([Schedule(self._next_seq(), self._clock(), request.request_id)])

    def on_preempt(self, request: Request) -> None:
        self._emit([Preempt(self._next_seq(), self._clock(), request.request_id)])

    def on_first_token(self, request: Request, num_tokens: int, age_ns: int | None) -> None:
        """Record a request's first output token, after `num_tokens` computed prompt tokens,
        `age_ns` after its arrival at vLLM's front end (None: not known)."""
        record = FirstToken(self._next_seq(), self._clock(), request.request_id, num_tokens, age_ns)
        self._emit([record])

    def on_finish(self, request: Request) -> None:
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
            None,  # the collector counts the cached ones among the free from the stream
            num_usable - num_free,
        )
        self._emit([record])

    # -- manager wrappers --------------------------------------------------------------

    def _make_add_local_computed_blocks(
        self, original: Callable[..., Any], group: int
    ) -> Callable[..., Any]:
        """A group's manager reusing its prefix hit: the `Hit` names the group, and starts
        where the hit's null blocks (vLLM's placeholders left of a window) end."""

        def add_local_computed_blocks(
            request_id: str, new_computed_blocks: Sequence[Any], *args: Any, **kwargs: Any
        ) -> None:
            self._group = group
            self._hit_length = len(new_computed_blocks)
            try:
                original(request_id, new_computed_blocks, *args, **kwargs)
            finally:
                self._group = 0
                self._hit_length = 0

        return add_local_computed_blocks

    def _make_allocate_new_blocks(self, original: Callable[..., Any], group: int) -> Any:
        """A group's manager taking blocks from the pool: the `Allocate` names the group."""

        def allocate(*args: Any, **kwargs: Any) -> Any:
            self._group = group
            try:
                return original(*args, **kwargs)
            finally:
                self._group = 0

        return allocate

    _make_allocate_external_computed_blocks = _make_allocate_new_blocks

    def _make_allocate_slots(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """The request whose blocks move, for the pool's hooks; and the tokens a KV connector
        loaded for it (the scheduler passes them by keyword, then records the lookup)."""

        def allocate_slots(request: Request, *args: Any, **kwargs: Any) -> Any:
            self._request = request
            self._tier_hit_tokens = kwargs.get("num_external_computed_tokens", 0)
            try:
                return original(request, *args, **kwargs)
            finally:
                self._request = None

        return allocate_slots

    def _make_free(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def free(request: Request, *args: Any, **kwargs: Any) -> None:
            self._request = request
            try:
                original(request, *args, **kwargs)
            finally:
                self._request = None
            if self._fingerprints:
                try:
                    self._fingerprints.forget(request.request_id)
                except Exception as error:
                    self.failed(error, "KVCacheManager.free")

        return free

    def _make_record_prefix_cache_stats(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def record_prefix_cache_stats(request: Request, num_hits: int, *args: Any) -> None:
            original(request, num_hits, *args)
            try:
                self._record_lookup(request, num_hits)
            except Exception as error:
                self.failed(error, "KVCacheManager.record_prefix_cache_stats")

        return record_prefix_cache_stats

    def _record_lookup(self, request: Request, num_hits: int) -> None:
        """A prefix-cache lookup, as vLLM counts one (`get_num_cached_tokens`, vLLM 0.34's
        probe for the waiting queue's order, counts none and is not hooked)."""
        if not self._manager.prefix_cache_lookup_enabled(request):
            return
        lora = request.lora_request.lora_name if request.lora_request else None
        record = Lookup(
            self._next_seq(),
            self._clock(),
            request.request_id,
            request.num_tokens,
            num_hits,
            num_hits // self.block_size,
            request.num_preemptions > 0,
            # Set by the scheduler from `get_computed_blocks` (0 in a dense layout).
            getattr(request, "shared_prefix_boundary", 0),
            self._tier_hit_tokens,
            lora=self._pseudonymizer.lora(lora),
        )
        self._emit([record])
