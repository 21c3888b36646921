"""Hybrid KV cache layouts: sliding-window and chunked-local groups, alone or beside full
attention, through vLLM's own hybrid coordinator. The hooks change nothing, and their records
say exactly what vLLM did, group by group; vLLM's own KV events are the witness."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from collector.cli import main
from collector.model.step_model import StepModel
from collector.replay.block_manager import (
    CacheSettings,
    make_block_hasher,
    make_kv_cache_manager,
    make_request,
)
from collector.replay.simulator import Simulator, VirtualClock
from collector.replay.traces import read_trace
from collector.store.cache_mirror import CacheMirrors
from collector.store.run_file import RunFile
from engine_hooks.events import Evict, Free, Hit, Pool, Store, unpack_counts
from tests.support.block_manager import make_hooks
from tests.support.kv_witness import evicted_blocks, stored_blocks, vllm_blocks
from tests.support.repo import SAMPLE_TRACE

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version

BLOCK_SIZE = 16
# Layouts, with pools small enough that the sample's first requests evict.
LAYOUTS = (
    ("gpt-oss", 700),  # full + sliding window (128 tokens)
    ("full,sliding_window:48,sliding_window:48", 700),  # Gemma-3-like, with a sliding window
    ("full,chunked_local:64", 700),  # Llama-4-like
    ("sliding_window:80", 300),  # one sliding-window group alone
    ("chunked_local:64", 400),  # one chunked-local group alone
)


class Driven(NamedTuple):
    """What a drive saw: vLLM's KV events, its prefix-cache counts, the hooks' records, the
    manager, and the blocks each group held after each step (from vLLM's own tables)."""

    events: list[Any]
    stats: list[int]
    records: list[Any]
    manager: Any
    in_use_by_group: list[list[int]]


def drive(layout: str, num_blocks: int, hooks_on: bool) -> Driven:
    """The sample trace's first 120 requests, with arrival times, through a manager of this
    layout."""
    settings = CacheSettings(BLOCK_SIZE, num_blocks, kv_layout=layout)
    manager = make_kv_cache_manager(settings, kv_events=True)
    hooks, buffer = make_hooks(manager, check_collisions=True)
    if hooks_on:
        hooks.attach()
    events: list[Any] = []
    clock = VirtualClock()
    in_use_by_group: list[list[int]] = []  # after each step, from vLLM's own tables

    def step() -> None:
        events.extend(manager.take_events())
        in_use_by_group.append(
            [
                len({block.block_id for table in single.req_to_blocks.values() for block in table})
                - any(block.is_null for table in single.req_to_blocks.values() for block in table)
                for single in manager.coordinator.single_type_managers
            ]
        )

    simulator = Simulator(
        manager, hooks if hooks_on else None, clock, make_block_hasher(settings), on_step=step
    )
    simulator.run_timestamps(read_trace(SAMPLE_TRACE)[:120], 16, StepModel(), lambda _: None)
    hooks.detach()
    stats = manager.make_prefix_cache_stats()
    counts = [stats.queries, stats.hits, stats.preempted_hits]
    return Driven(events, counts, buffer.take(), manager, in_use_by_group)


@pytest.mark.parametrize(("layout", "num_blocks"), LAYOUTS)
def test_hooks_change_nothing_in_a_hybrid_manager(layout: str, num_blocks: int) -> None:
    events_off, stats_off, *_ = drive(layout, num_blocks, hooks_on=False)
    events_on, stats_on, records, manager, _ = drive(layout, num_blocks, hooks_on=True)

    assert stats_on == stats_off
    assert stats_on[1] > 0, "the prefix cache must be hit"
    assert events_on == events_off  # every block stored and removed, in the same order
    removed = [event for event in events_on if type(event).__name__ == "BlockRemoved"]
    assert len(removed) > 100, "the pool must be small enough to evict"
    groups = manager.kv_cache_config.kv_cache_groups
    assert {record.kv_group for record in records if isinstance(record, Store)} == set(
        range(len(groups))
    )


@pytest.mark.parametrize(("layout", "num_blocks"), LAYOUTS)
def test_records_say_what_vllm_stored_and_removed_group_by_group(
    layout: str, num_blocks: int
) -> None:
    events, _, records, *_ = drive(layout, num_blocks, hooks_on=True)
    completed = CacheMirrors(num_blocks).complete(records)

    assert stored_blocks(completed) == vllm_blocks(events, "BlockStored")
    assert evicted_blocks(completed) == vllm_blocks(events, "BlockRemoved")
    assert not any(type(record).__name__ == "Collision" for record in records)


@pytest.mark.parametrize(("layout", "num_blocks"), LAYOUTS[:3])
def test_pool_records_count_the_blocks_each_group_holds(layout: str, num_blocks: int) -> None:
    driven = drive(layout, num_blocks, hooks_on=True)
    completed = CacheMirrors(num_blocks).complete(driven.records)
    pools = [record for record in completed if isinstance(record, Pool)]
    assert [pool.num_in_use_by_group for pool in pools] == driven.in_use_by_group
    assert all(sum(pool.num_in_use_by_group or ()) == pool.num_in_use for pool in pools)
    assert max(pool.num_in_use for pool in pools) > num_blocks // 2


def serve(manager: Any, request: Any) -> None:
    """One request as the scheduler serves it: look up, allocate, count the lookup, compute
    the prompt and one output token, free."""
    blocks, num_hit_tokens, boundary = manager.get_computed_blocks(request)
    request.shared_prefix_boundary = boundary
    manager.allocate_slots(request, request.num_tokens - num_hit_tokens, num_hit_tokens, blocks)
    manager.record_prefix_cache_stats(request, num_hit_tokens)
    request.num_computed_tokens = request.num_tokens
    request.append_output_token_ids([7])
    manager.allocate_slots(request, 1)
    manager.free(request)


def test_a_hit_the_window_cuts_short_says_how_far_full_attention_had_it() -> None:
    """Full attention keeps a 100-token prompt's six full blocks; with vLLM's default
    retention (`prefix_cache_retention_interval` 0) the window group keeps only the blocks
    where that prompt ends. A second request of the same prefix reuses nothing where full
    attention alone held 96 tokens, and marks 96 for its window to keep; once vLLM's
    `evict_blocks` drops those two window blocks, a third is cut short the same way."""
    settings = CacheSettings(BLOCK_SIZE, 40, kv_layout="full,sliding_window:32")
    manager = make_kv_cache_manager(settings)
    hooks, buffer = make_hooks(manager)
    hooks.attach()
    block_hasher = make_block_hasher(settings)
    prefix = list(range(100))
    serve(manager, make_request("first", [*prefix, *[1000] * 20], block_hasher))
    serve(manager, make_request("second", [*prefix, *[2000] * 20], block_hasher))
    stored = CacheMirrors(40).complete(buffer.take())
    window_blocks = [
        block_id
        for record in stored
        if isinstance(record, Store) and record.kv_group == 1 and record.request_id == "second"
        for position, block_id in enumerate(unpack_counts(record.block_ids), record.first_position)
        if position in (4, 5)
    ]
    assert len(window_blocks) == 2
    manager.block_pool.evict_blocks(set(window_blocks))
    serve(manager, make_request("third", [*prefix, *[3000] * 20], block_hasher))
    hooks.detach()
    records = stored + buffer.take()
    lookups = [
        (record.num_hit_tokens, record.longest_group_hit_tokens)
        for record in records
        if type(record).__name__ == "Lookup"
    ]
    assert lookups == [(0, 0), (0, 96), (0, 96)]
    (evict,) = [
        record
        for record in CacheMirrors(40).complete(records)
        if isinstance(record, Evict) and record.request_id is None
    ]
    assert unpack_counts(evict.kv_groups or b"") == [1, 1]


def test_a_window_hit_starts_where_the_window_does_and_frees_name_their_groups() -> None:
    """gpt-oss-like layout, 32-token window: the second request of a 100-token prefix marks
    96 for the window to keep (above), so the third reuses six full-attention blocks from
    position 0, and the window's last two from 4."""
    settings = CacheSettings(BLOCK_SIZE, 40, kv_layout="full,sliding_window:32")
    manager = make_kv_cache_manager(settings)
    hooks, buffer = make_hooks(manager)
    hooks.attach()
    block_hasher = make_block_hasher(settings)
    for index in range(3):
        serve(manager, make_request(f"r{index}", [*range(100), *[1000 + index] * 20], block_hasher))
    hooks.detach()
    completed = CacheMirrors(40).complete(buffer.take())
    hits = [
        (
            record.request_id,
            record.kv_group,
            record.first_position,
            len(unpack_counts(record.block_ids)),
        )
        for record in completed
        if isinstance(record, Hit)
    ]
    assert hits == [("r2", 0, 0, 6), ("r2", 1, 4, 2)]
    # Each freed block is named with the group that allocated it, frees across groups too.
    allocated_by: dict[int, int] = {}
    for record in completed:
        if type(record).__name__ == "Allocate":
            allocated_by.update(dict.fromkeys(unpack_counts(record.block_ids), record.kv_group))
        if isinstance(record, Free):
            ids, groups = unpack_counts(record.block_ids), unpack_counts(record.kv_groups or b"")
            assert groups == [allocated_by[block_id] for block_id in ids]
    assert manager.block_pool.get_num_free_blocks() == 39


@pytest.mark.parametrize("timing", ["scheduler", "timestamps"])
def test_a_hybrid_replay_stores_each_row_with_its_group(tmp_path: Path, timing: str) -> None:
    out = tmp_path / "run.duckdb"
    code = main(
        [
            "replay",
            str(SAMPLE_TRACE),
            "--out",
            str(out),
            "--kv-layout",
            "gpt-oss",
            "--num-blocks",
            "900",
            "--limit",
            "150",
            "--timing",
            timing,
            "--quiet",
        ]
    )
    assert code == 0
    with RunFile.open(out) as run:
        options = json.loads(run.record("SELECT options FROM runs")["options"])
        per_group = dict(
            run.rows(
                "SELECT kind::VARCHAR || '/' || kv_group, count(*) FROM events "
                "WHERE block_id IS NOT NULL GROUP BY ALL"
            )
        )
        summary = run.record("SELECT * FROM runs")
    assert options["kv_layout"] == "gpt-oss"
    assert [group["kind"] for group in options["kv_groups"]] == ["full", "sliding_window"]
    assert options["kv_groups"][1]["window"] == 128
    kinds = Counter(key.split("/")[0] for key in per_group)
    assert {key for key in per_group if key.startswith(("store", "hit", "allocate", "free"))} >= {
        f"{kind}/{group}" for kind in ("store", "hit", "allocate", "free") for group in (0, 1)
    }
    assert kinds["evict"] >= 1
    assert summary["vllm_prefix_cache_hits"] > 0


def test_an_mla_group_beside_a_window_is_mirrored_as_full_attention() -> None:
    """DeepSeek-style MLA layers are full attention to vLLM's block manager."""
    import torch  # noqa: PLC0415 - torch takes seconds to load; only what drives vLLM pays
    from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.v1.kv_cache_interface import (  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
        KVCacheConfig,
        KVCacheGroupSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
    )

    shape = {"block_size": BLOCK_SIZE, "num_kv_heads": 1, "head_size": 64, "dtype": torch.float16}
    groups = [
        KVCacheGroupSpec(["mla"], MLAAttentionSpec(**shape)),  # type: ignore[arg-type]
        KVCacheGroupSpec(["swa"], SlidingWindowSpec(**shape, sliding_window=32)),  # type: ignore[arg-type]
    ]
    config = KVCacheConfig(num_blocks=40, kv_cache_tensors=[], kv_cache_groups=groups)
    manager = KVCacheManager(
        config, max_model_len=1024, scheduler_block_size=BLOCK_SIZE, hash_block_size=BLOCK_SIZE
    )
    hooks, buffer = make_hooks(manager)
    hooks.attach()
    assert [group.kind for group in hooks.layout.groups] == ["full", "sliding_window"]
    block_hasher = make_block_hasher(CacheSettings(BLOCK_SIZE))
    for index in range(2):
        serve(manager, make_request(f"r{index}", [*range(100), *[1000 + index] * 20], block_hasher))
    hooks.detach()
    hits = [
        (record.kv_group, record.first_position, len(unpack_counts(record.block_ids)))
        for record in buffer.take()
        if isinstance(record, Hit)
    ]
    assert hits == [(0, 0, 6), (1, 4, 2)]
