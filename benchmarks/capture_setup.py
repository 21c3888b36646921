"""The engine side of capture as the benchmarks build it: kvscope's hooks on a manager, and
the transport that ships their records to a collector."""

from __future__ import annotations

from typing import Any

from engine_hooks import EventBuffer, KVCacheHooks, Pseudonymizer
from engine_hooks.transport import Transport


def make_hooks(
    manager: Any, buffer: EventBuffer, clock: Any, *, check_collisions: bool
) -> KVCacheHooks:
    """kvscope's hooks for `manager`, recording into `buffer`, not attached yet (the
    scheduler's hooks attach them)."""
    return KVCacheHooks(
        manager,
        buffer,
        pseudonymizer=Pseudonymizer(b"bench"),
        clock=clock,
        check_collisions=check_collisions,
    )


def attach_hooks(
    manager: Any, buffer: EventBuffer, clock: Any, *, check_collisions: bool
) -> KVCacheHooks:
    """kvscope's hooks, attached to `manager`, recording into `buffer`."""
    return make_hooks(manager, buffer, clock, check_collisions=check_collisions).attach()


def bench_transport(
    buffer: EventBuffer, endpoint: str, settings: Any, engine_id: str = "bench", **options: Any
) -> Transport:
    """A transport for `buffer`'s records, naming the cache `settings` (a `CacheSettings`) to
    the collector as an engine would (as `engine_id`: one per transport into one collector);
    `options` go to `Transport` (its interval, ...)."""
    run_config = {
        "block_size": settings.block_size,
        "num_blocks": settings.num_blocks,
        "hash_algo": settings.hash_algo,
        "vllm_version": "bench",
    }
    return Transport(buffer, endpoint, engine_id=engine_id, config=run_config, **options)
