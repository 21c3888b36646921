"""A full-attention group beside a Mamba group (Qwen3-Next, Jamba, Nemotron-H), driven by vLLM's
real Scheduler, which splits a Mamba prefill at the block boundaries whose states it caches.
The hooks change nothing, and their records say exactly what vLLM stored and removed, group
by group; vLLM's own KV events are the witness."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from collector.queries import kv_groups
from collector.queries.summary import run_summary
from collector.replay.block_manager import CacheSettings, make_block_hasher, make_request
from collector.store.cache_mirror import CacheMirrors
from collector.store.run_file import RunFile, RunStore
from engine_hooks import UnsupportedCacheLayout
from engine_hooks.events import Evict, Hit, Store, unpack_counts, unpack_hashes
from tests.support.app import go_to, start
from tests.support.block_manager import make_hooks
from tests.support.engine import collector_process, drive, make_scheduler, workload
from tests.support.kv_witness import evicted_blocks, ints, stored_blocks, vllm_blocks

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version

BLOCK_SIZE = 16
NUM_BLOCKS = 400  # small enough that the workload evicts


class KvEventSink:
    """Where the scheduler publishes vLLM's KV event batches: kept, in order."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def publish(self, batch: Any) -> None:
        self.events.extend(batch.events)

    def shutdown(self) -> None:
        return None


class Driven(NamedTuple):
    events: list[Any]
    result: Any
    records: list[Any]
    kinds: list[str]  # the hooks' layout: each group's kind
    transient_drops: int  # vLLM's drops of transient checkpoint blocks (on unkeyed blocks)


def count_transient_drops(scheduler: Any) -> list[int]:
    """Count the Mamba manager's own `_maybe_evict_cached_block` calls (for a transient
    checkpoint), and which of them found the block keyed: [calls, keyed]."""
    mamba = scheduler.kv_cache_manager.coordinator.single_type_managers[1]
    pool = mamba.block_pool
    counts = [0, 0]
    cache_tail, evict = mamba._cache_partial_tail_block, pool._maybe_evict_cached_block

    def counting_evict(block: Any) -> bool:
        counts[0] += 1
        counts[1] += block.block_hash is not None
        return bool(evict(block))

    def cache_tail_counting(*args: Any, **kwargs: Any) -> Any:
        pool._maybe_evict_cached_block = counting_evict
        try:
            return cache_tail(*args, **kwargs)
        finally:
            del pool._maybe_evict_cached_block

    mamba._cache_partial_tail_block = cache_tail_counting
    return counts


def run(tmp_path: Path, hooks_on: bool, checkpoints: bool = False, budget: int = 4096) -> Driven:
    scheduler = make_scheduler(
        tmp_path / "model",
        BLOCK_SIZE,
        NUM_BLOCKS,
        max_num_seqs=8,
        mamba=True,
        mamba_checkpoints=checkpoints,
        kv_events=True,
        max_num_batched_tokens=budget,
    )
    sink = KvEventSink()
    scheduler.kv_event_publisher = sink
    hooks, buffer = make_hooks(scheduler.kv_cache_manager, check_collisions=True)
    drops = count_transient_drops(scheduler)
    if hooks_on:
        hooks.attach()
    result = drive(scheduler, workload(), per_step=3)
    hooks.detach()
    assert drops[1] == 0, "vLLM dropped a keyed checkpoint block: the hooks did not see it"
    kinds = [group.kind for group in hooks.layout.groups]
    return Driven(sink.events, result, buffer.take(), kinds, drops[0])


# How vLLM keeps the Mamba states: the scheduler ends prefill chunks at block boundaries;
# or (as vLLM's Mamba 2 layers do) a prefill checkpoint block exports the state inside a
# chunk, here with a 256-token budget, so long prompts take several chunks and vLLM drops
# transient checkpoints with `_maybe_evict_cached_block`, which the hooks do not see.
MODES = [pytest.param(False, 4096, id="aligned-chunks"), pytest.param(True, 256, id="checkpoints")]


@pytest.mark.parametrize(("checkpoints", "budget"), MODES)
def test_hooks_change_nothing_beside_a_mamba_group(
    tmp_path: Path, checkpoints: bool, budget: int
) -> None:
    off = run(tmp_path, hooks_on=False, checkpoints=checkpoints, budget=budget)
    on = run(tmp_path, hooks_on=True, checkpoints=checkpoints, budget=budget)

    assert on.result == off.result  # the same steps, lookups, hits and finished requests
    assert on.result.hits > 0, "the prefix cache must be hit"
    assert on.events == off.events  # every block stored and removed, in the same order
    removed = [event for event in on.events if type(event).__name__ == "BlockRemoved"]
    assert len(removed) > 50, "the pool must be small enough to evict"
    assert on.kinds == ["full", "mamba"]
    assert (on.transient_drops > 0) == checkpoints


@pytest.mark.parametrize(("checkpoints", "budget"), MODES)
def test_records_say_what_vllm_stored_and_removed_in_each_group(
    tmp_path: Path, checkpoints: bool, budget: int
) -> None:
    driven = run(tmp_path, hooks_on=True, checkpoints=checkpoints, budget=budget)
    completed = CacheMirrors(NUM_BLOCKS).complete(driven.records)

    stored = vllm_blocks(driven.events, "BlockStored")
    assert stored_blocks(completed) == stored
    assert {group for group, _ in stored} == {0, 1}
    assert evicted_blocks(completed) == vllm_blocks(driven.events, "BlockRemoved")
    assert not any(type(record).__name__ == "Collision" for record in driven.records)


def test_a_mamba_hit_reuses_one_state_block_where_the_prefix_ends(tmp_path: Path) -> None:
    """Full attention reuses every block of a hit from position 0; the Mamba group reuses
    only the state block at the hit's last boundary (vLLM's nulls stand for the rest)."""
    driven = run(tmp_path, hooks_on=True)
    full_hit: dict[str, int] = {}  # per request, the blocks of its last full-attention hit
    num_checked = 0
    for record in driven.records:
        if isinstance(record, Hit) and record.kv_group == 0:
            assert record.first_position == 0
            full_hit[record.request_id] = len(unpack_counts(record.block_ids))
        elif isinstance(record, Hit):
            assert len(unpack_counts(record.block_ids)) == 1
            assert record.first_position + 1 == full_hit[record.request_id]
        elif type(record).__name__ == "Lookup" and record.num_hit_tokens:
            # vLLM's hit is the prefix both groups serve: where the Mamba state was cached.
            assert record.num_hit_tokens == full_hit.pop(record.request_id) * BLOCK_SIZE
            num_checked += 1
    assert num_checked > 20


def test_a_captured_mamba_hybrid_run_names_its_groups_on_the_kv_groups_page(
    tmp_path: Path, capture_environment: str
) -> None:
    """The plugin captures the hybrid engine as vLLM loads it, into a real `kvscope collect`:
    the run's hits are vLLM's own, and its KV cache groups page shows the Mamba group."""
    run = tmp_path / "run.duckdb"
    with collector_process(run, capture_environment) as process:
        scheduler = make_scheduler(
            tmp_path / "model", BLOCK_SIZE, NUM_BLOCKS, max_num_seqs=8, mamba=True
        )
        capture = scheduler.kvscope_capture
        result = drive(scheduler, workload(), per_step=3)
        scheduler.shutdown()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    assert capture.hooks.num_lost == 0 and capture.transport.num_dropped == 0
    store = RunStore.open(run)
    summary = run_summary(store)
    store.close()
    assert (summary["prompt_tokens"], summary["hit_tokens"]) == (result.queries, result.hits)
    assert summary["dropped_events"] == 0 and summary["collisions"] == 0
    with RunFile.open(run) as run_file:
        figures = kv_groups.group_figures(run_file)
    assert list(figures["kind"]) == ["full attention", "Mamba state"]
    assert (figures["block_hits"] > 0).all() and (figures["evicted"] > 0).all()
    app = go_to(start(run), "views/kv_groups.py")
    assert list(app.dataframe[0].value["attention"]) == ["full attention", "Mamba state"]


def test_a_block_cached_at_a_prompt_boundary_is_a_store_and_its_old_key_an_evict() -> None:
    """vLLM's `cache_partial_block` (a Mamba group's prompt-boundary state) keys one block
    outside `cache_full_blocks`, replacing a shorter prefix's key if the block had one."""
    manager = _full_and_mamba_manager(kv_events=True)
    hooks, buffer = make_hooks(manager)
    hooks.attach()
    request = make_request("r", list(range(50)), make_block_hasher(CacheSettings(BLOCK_SIZE)))
    pool = manager.block_pool
    (block,) = pool.get_new_blocks(1)
    pool.cache_partial_block(request, block, 32, 1, BLOCK_SIZE)  # a new key
    pool.cache_partial_block(request, block, 32, 1, BLOCK_SIZE)  # the same: nothing to record
    pool.cache_partial_block(request, block, 48, 1, BLOCK_SIZE)  # a longer prefix's key
    hooks.detach()
    records = CacheMirrors(32).complete(buffer.take())
    events = manager.take_events()

    stores = [
        (r.first_position, r.kv_group, ints(unpack_hashes(r)))
        for r in records
        if isinstance(r, Store)
    ]
    assert stores == [
        (position, 1, [event.block_hashes[0]])
        for position, event in zip(
            (1, 2), [e for e in events if type(e).__name__ == "BlockStored"], strict=True
        )
    ]
    (evict,) = [record for record in records if isinstance(record, Evict)]
    (removed,) = [event for event in events if type(event).__name__ == "BlockRemoved"]
    assert unpack_counts(evict.block_ids) == [block.block_id]
    assert ints(unpack_hashes(evict)) == removed.block_hashes
    assert unpack_counts(evict.kv_groups or b"") == [1]


def _full_and_mamba_manager(kv_events: bool = False, **mamba_options: int) -> Any:
    """A `KVCacheManager` of a full-attention group and a Mamba group, as vLLM's tests build
    one (16-token blocks, 32 of them)."""
    import torch  # noqa: PLC0415 - torch takes seconds to load; only what drives vLLM pays
    from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.v1.kv_cache_interface import (  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
    )

    full = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float16
    )
    mamba = MambaSpec(
        block_size=BLOCK_SIZE,
        shapes=((1,),),
        dtypes=(torch.float16,),
        mamba_cache_mode="align",
        **mamba_options,  # type: ignore[arg-type]
    )
    config = KVCacheConfig(
        num_blocks=32,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["l0"], full), KVCacheGroupSpec(["l1"], mamba)],
    )
    return KVCacheManager(
        config,
        max_model_len=1024,
        scheduler_block_size=BLOCK_SIZE,
        hash_block_size=BLOCK_SIZE,
        enable_kv_cache_events=kv_events,
    )


def test_speculative_mamba_blocks_are_refused() -> None:
    """The Mamba manager moves speculative (MTP) blocks within the block table itself:
    kvscope says so rather than record a stream it has not proved."""
    manager = _full_and_mamba_manager(num_speculative_blocks=1)
    with pytest.raises(UnsupportedCacheLayout, match=r"group 1 \(MambaSpec\): .*speculative"):
        make_hooks(manager)
    assert manager.allocate_slots.__self__ is manager, "nothing was attached"
