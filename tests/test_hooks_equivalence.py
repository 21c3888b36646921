"""The hooks must not change vLLM: same hits, same blocks, same evictions in the same order."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from collector.replay.block_manager import make_request
from collector.replay.traces import read_trace
from collector.store.cache_mirror import CacheMirrors
from engine_hooks.events import Evict, unpack_counts, unpack_hashes
from engine_hooks.hooks import MANAGER_METHODS
from engine_hooks.pool_hooks import POOL_METHODS
from tests.support.block_manager import make_hooks, make_manager

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version

BLOCK_SIZE = 16
NUM_BLOCKS = 40_000  # 640k tokens: the first 300 prompts (4.6M tokens) hit and evict


def drive(trace_path: Path, hooks_on: bool) -> tuple[list[tuple[Any, ...]], list[Any], list[Any]]:
    """Replay the first 300 requests; return per-request facts, vLLM's removals, and the
    evictions the collector derives from the hooks' records (`CacheMirrors`).

    Evicted block ids come from vLLM's own state: a block handed out for a request that held
    a hash in the free queue just before was evicted, in the order vLLM handed it out.
    """
    manager, block_hasher = make_manager(BLOCK_SIZE, NUM_BLOCKS, kv_events=True)
    hooks, buffer = make_hooks(manager)
    if hooks_on:
        hooks.attach()
    facts: list[tuple[Any, ...]] = []
    removed: list[Any] = []
    for index, trace_request in enumerate(read_trace(trace_path)[:300]):
        request = make_request(
            trace_request.request_id, trace_request.prompt_token_ids(), block_hasher
        )
        hashed_before = {
            block.block_id: block.block_hash
            for block in manager.block_pool.free_block_queue.get_all_free_blocks()
        }
        blocks, num_hit_tokens, _ = manager.get_computed_blocks(request)
        new_blocks = manager.allocate_slots(
            request, request.num_tokens - num_hit_tokens, num_hit_tokens, blocks
        )
        assert new_blocks is not None
        manager.record_prefix_cache_stats(request, num_hit_tokens)
        new_ids = new_blocks.get_block_ids()[0]
        evicted = [block_id for block_id in new_ids if hashed_before[block_id] is not None]
        request.num_computed_tokens = request.num_tokens
        request.append_output_token_ids([10**9 + index])
        facts.append((num_hit_tokens, manager.get_block_ids(request.request_id), evicted))
        manager.free(request)
        removed.extend(
            event.block_hashes
            for event in manager.take_events()
            if type(event).__name__ == "BlockRemoved"
        )
    completed = CacheMirrors(NUM_BLOCKS).complete(buffer.take())
    ours = [record for record in completed if isinstance(record, Evict)]
    hooks.detach()
    return facts, removed, ours


def test_hooks_do_not_change_hits_blocks_or_evictions(mooncake_trace: Path) -> None:
    facts_off, removed_off, ours_off = drive(mooncake_trace, hooks_on=False)
    facts_on, removed_on, ours_on = drive(mooncake_trace, hooks_on=True)

    assert ours_off == []
    assert len(facts_on) == 300
    assert sum(1 for facts in facts_on if facts[0] > 0) >= 5, "the prefix cache must be hit"
    evicted_off = [block_id for facts in facts_off for block_id in facts[2]]
    assert len(evicted_off) > 10_000, "the pool must be small enough to evict"

    assert [facts[0] for facts in facts_on] == [facts[0] for facts in facts_off]
    assert [facts[1] for facts in facts_on] == [facts[1] for facts in facts_off]
    assert [facts[2] for facts in facts_on] == [facts[2] for facts in facts_off]
    assert removed_on == removed_off

    # And the hooks' records say exactly those evictions, in that order, under those hashes.
    assert [
        block_id for record in ours_on for block_id in unpack_counts(record.block_ids)
    ] == evicted_off
    # vLLM's events carry the low 64 bits of each hash, as kvscope's run files do.
    assert [
        [int.from_bytes(block_hash[-8:], "big")]
        for record in ours_on
        for block_hash in unpack_hashes(record)
    ] == removed_off


def test_detach_restores_the_manager_exactly() -> None:
    manager, _ = make_manager(BLOCK_SIZE, 64)
    pool = manager.block_pool
    hooks, _ = make_hooks(manager)
    hooks.attach()
    assert getattr(manager.allocate_slots, "__self__", None) is None, "a hook, not vLLM's method"
    assert getattr(pool.get_new_blocks, "__self__", None) is None
    hooks.detach()
    for target, names in ((manager, MANAGER_METHODS), (pool, POOL_METHODS)):
        for name in names:
            method = getattr(target, name)
            assert method.__self__ is target
            assert method.__func__ is getattr(type(target), name)
    # Only now look inside: attach and detach left no instance attribute behind.
    assert not set(MANAGER_METHODS) & set(vars(manager))
    assert not set(POOL_METHODS) & set(vars(pool))


def test_attaching_twice_is_refused() -> None:
    manager, _ = make_manager(BLOCK_SIZE, 64)
    first, _ = make_hooks(manager)
    first.attach()
    second, _ = make_hooks(manager)
    with pytest.raises(RuntimeError, match="already patched"):
        second.attach()
    first.detach()
    assert manager.allocate_slots.__self__ is manager


def test_free_blocks_passes_vllms_own_arguments_on() -> None:
    """vLLM 0.34's `free_blocks(blocks, evict_first=True)` (its CPU offload connectors free
    blocks another tier holds that way): the hooked pool's free queue ends as vLLM's own."""
    from vllm.v1.core.block_pool import BlockPool  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    if "evict_first" not in inspect.signature(BlockPool.free_blocks).parameters:
        pytest.skip("this vLLM's free_blocks takes the blocks alone (before 0.34)")

    def freed_order(hooks_on: bool) -> tuple[list[int], list[Any]]:
        manager, block_hasher = make_manager(BLOCK_SIZE, 64)
        hooks, buffer = make_hooks(manager)
        if hooks_on:
            hooks.attach()
        request = make_request("r", list(range(BLOCK_SIZE * 4)), block_hasher)
        manager.allocate_slots(request, request.num_tokens)  # stores its 4 full blocks
        pool = manager.block_pool
        blocks = manager.coordinator.single_type_managers[0].req_to_blocks["r"]
        assert all(block.block_hash is not None for block in blocks)
        pool.free_blocks(list(blocks), evict_first=True)
        order = [block.block_id for block in pool.free_block_queue.get_all_free_blocks()]
        return order, [type(record).__name__ for record in buffer.take()]

    bare, _ = freed_order(hooks_on=False)
    hooked, records = freed_order(hooks_on=True)
    assert hooked == bare
    assert records == ["Allocate", "Store", "Free"]
