"""Property tests: for any workload, hooks on or off give the same vLLM behaviour, and what
the collector derives from the hooks' records (`CacheMirrors`: evictions on reuse, cached
and cached-free blocks) matches vLLM's pool state after every step."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from collector.replay.block_manager import make_request
from collector.store.cache_mirror import CacheMirrors
from engine_hooks.events import (
    Evict,
    Hit,
    Pool,
    Reset,
    Store,
    num_blocks,
    pack_counts,
    pack_hashes,
    unpack_hashes,
)
from tests.support.block_manager import (
    cached_block_count,
    cached_free_count,
    make_hooks,
    make_manager,
)

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version

BLOCK_SIZE = 4
NUM_BLOCKS = 12  # small enough that blocks get handed out again (evictions on reuse)

prefixes = st.lists(st.integers(0, 50), min_size=0, max_size=12)
request_specs = st.tuples(
    st.integers(0, 3),  # which shared prefix
    st.lists(st.integers(0, 50), min_size=1, max_size=10),  # own tail
    st.integers(0, 6),  # output tokens
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), request_specs),
        st.tuples(st.just("finish"), st.integers(0, 7)),
        st.tuples(st.just("decode"), st.integers(0, 7)),
        st.tuples(st.just("reset"), st.just(0)),
        st.tuples(st.just("evict"), st.integers(1, NUM_BLOCKS - 1)),
    ),
    max_size=60,
)


def run(ops: list[Any], shared: list[list[int]], hooks_on: bool) -> tuple[list[Any], Any, Any]:
    manager, block_hasher = make_manager(BLOCK_SIZE, NUM_BLOCKS)
    hooks, buffer = make_hooks(manager)
    mirrors = CacheMirrors(NUM_BLOCKS)
    if hooks_on:
        hooks.attach()
    outcomes: list[Any] = []
    running: list[Any] = []
    for number, (name, argument) in enumerate(ops):
        if name == "admit":
            prefix_index, tail, num_outputs = argument
            request = make_request(f"r{number}", shared[prefix_index] + tail, block_hasher)
            blocks, num_hits, _ = manager.get_computed_blocks(request)
            allocated = manager.allocate_slots(
                request, request.num_tokens - num_hits, num_hits, blocks
            )
            outcomes.append(
                (name, num_hits, None if allocated is None else allocated.get_block_ids())
            )
            if allocated is not None:
                manager.record_prefix_cache_stats(request, num_hits)
                request.num_computed_tokens = request.num_tokens
                request.append_output_token_ids(list(range(900, 900 + num_outputs)))
                running.append(request)
        elif name in ("finish", "decode") and running:
            request = running[argument % len(running)]
            if name == "finish":
                running.remove(request)
                manager.free(request)
                outcomes.append((name, request.request_id))
            elif request.num_computed_tokens < request.num_tokens:
                allocated = manager.allocate_slots(request, 1)
                outcomes.append((name, None if allocated is None else allocated.get_block_ids()))
                if allocated is not None:
                    request.num_computed_tokens += 1
        elif name == "reset":
            outcomes.append((name, manager.reset_prefix_cache()))
        elif name == "evict":
            manager.evict_blocks({argument})
            outcomes.append((name, argument))
        if hooks_on:
            hooks.record_pool_state()
            taken = buffer.take()
            completed = mirrors.complete(taken)
            assert mirrors.mirror(("", 0)).num_cached == cached_block_count(manager)
            last = completed[-1]
            assert isinstance(last, Pool)
            assert last.num_cached_free == cached_free_count(manager)
            assert min(last.num_free, last.num_cached_free, last.num_in_use) >= 0
            assert last.num_cached_free <= last.num_free
            outcomes.append(("records", taken, completed))
    final_state = [
        (block.block_id, block.ref_cnt, block.block_hash) for block in manager.block_pool.blocks
    ]
    free_order = [
        block.block_id for block in manager.block_pool.free_block_queue.get_all_free_blocks()
    ]
    return outcomes, final_state, (free_order, cached_block_count(manager))


# Blocks stored, freed, then handed out again: evictions on reuse, which the collector derives.
REUSE = [("admit", (0, list(range(20)), 0)), ("finish", 0)]
REUSE += [("admit", (1, [number] * 22, 0)) for number in range(1, 6)] + [("finish", 0)] * 5


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations, shared=st.lists(prefixes, min_size=4, max_size=4))
@example(ops=REUSE, shared=[list(range(8)), [9], [10], [11]])
def test_hooks_never_change_vllm_and_account_exactly(
    ops: list[Any], shared: list[list[int]]
) -> None:
    outcomes_on, state_on, (order_on, cached_on) = run(ops, shared, hooks_on=True)
    outcomes_off, state_off, (order_off, _) = run(ops, shared, hooks_on=False)
    sent = [record for name, *rest in outcomes_on if name == "records" for record in rest[0]]
    records = [record for name, *rest in outcomes_on if name == "records" for record in rest[1]]
    assert [outcome for outcome in outcomes_on if outcome[0] != "records"] == outcomes_off
    assert state_on == state_off
    assert order_on == order_off
    stores = sum(num_blocks(record) for record in records if isinstance(record, Store))
    evictions = sum(num_blocks(record) for record in records if isinstance(record, Evict))
    cleared = sum(record.num_cleared for record in records if isinstance(record, Reset))
    assert stores - evictions - cleared == cached_on
    sequence = [record.seq for record in sent]  # the hooks' own records
    assert sequence == list(range(len(sequence))), "no gaps, no reordering"


@given(st.sampled_from([8, 16, 32, 12]), st.integers(0, 40), st.randoms())
def test_packed_hashes_keep_the_low_8_bytes_of_each(width: int, count: int, rng: Any) -> None:
    """vLLM hashes at 8, 16 or 32 bytes (12: a width no hash algorithm of vLLM's has)."""
    hashes = [rng.randbytes(width) for _ in range(count)]
    record = Hit(0, 0, None, pack_counts(list(range(count))), pack_hashes(hashes))
    assert unpack_hashes(record) == [block_hash[-8:] for block_hash in hashes]
