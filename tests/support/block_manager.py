"""Tiny helpers for tests that drive vLLM's real KV cache manager directly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from collector.replay.block_manager import CacheSettings, make_block_hasher, make_kv_cache_manager
from collector.replay.replayer import ReplayOptions, replay
from collector.replay.simulator import Simulator, VirtualClock
from collector.replay.traces import read_trace
from engine_hooks import Event, EventBuffer, KVCacheHooks, Pseudonymizer
from tests.support.repo import SAMPLE_TRACE, SECRET


def make_manager(block_size: int, num_blocks: int, kv_events: bool = False) -> Any:
    """A real KVCacheManager; `kv_events` turns on vLLM's own KV events as a witness."""
    settings = CacheSettings(block_size, num_blocks)
    manager = make_kv_cache_manager(settings, kv_events=kv_events)
    return manager, make_block_hasher(settings)


def make_hooks(manager: Any, clock: Any = None, **kwargs: Any) -> tuple[KVCacheHooks, EventBuffer]:
    buffer = EventBuffer()
    options: dict[str, Any] = {"pseudonymizer": Pseudonymizer(SECRET)}
    if clock is not None:
        options["clock"] = clock
    options.update(kwargs)
    return KVCacheHooks(manager, buffer, **options), buffer


def cached_block_count(manager: Any) -> int:
    """Blocks that hold a prefix-cache hash, read from vLLM's own pool."""
    return sum(1 for block in manager.block_pool.blocks if block.block_hash is not None)


def cached_free_count(manager: Any) -> int:
    """Free blocks that still hold a hash, read from vLLM's own free queue."""
    free_blocks = manager.block_pool.free_block_queue.get_all_free_blocks()
    return sum(1 for block in free_blocks if block.block_hash is not None)


def tiny_run(directory: Any, rows: list[dict[str, Any]], **options: Any) -> Any:
    """Replay a handcrafted kvscope trace into `directory/run.duckdb`; return its path.

    Options are ReplayOptions fields, plus block_size / num_blocks for the cache.
    """
    trace = directory / "trace.jsonl"
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    settings = CacheSettings(options.pop("block_size", 4), options.pop("num_blocks", 5))
    out = directory / "run.duckdb"
    replay(trace, out, ReplayOptions(settings=settings, **options), SECRET)
    return out


def sample_engine_steps(
    settings: CacheSettings, num_requests: int, engine_id: str = "", dp_rank: int = 0
) -> Iterator[list[Event]]:
    """The records of the sample trace's first requests through vLLM's manager, one list per
    scheduler step, named as the collector names an engine's records."""
    manager = make_kv_cache_manager(settings)
    buffer = EventBuffer()
    clock = VirtualClock()
    hooks = KVCacheHooks(manager, buffer, pseudonymizer=Pseudonymizer(b"t"), clock=clock)
    steps: list[list[Event]] = []
    simulator = Simulator(
        manager,
        hooks.attach(),
        clock,
        make_block_hasher(settings),
        lambda: steps.append(buffer.take()),
    )
    simulator.run_sequential(read_trace(SAMPLE_TRACE)[:num_requests], lambda _: None)
    hooks.detach()
    for records in steps:
        for record in records:
            record.engine_id, record.dp_rank = engine_id, dp_rank
        yield records
