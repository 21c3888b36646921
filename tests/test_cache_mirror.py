"""The collector's mirror of each engine's cache (`collector/store/cache_mirror.py`): a
collector resumed on its run file derives what an unbroken one does, and records lost on
the way never push its counts out of bounds or invent a hash."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from collector.model.step_model import StepModel
from collector.replay.block_manager import CacheSettings
from collector.replay.simulator import Simulator, VirtualClock
from collector.replay.traces import read_trace
from collector.store.cache_mirror import CacheMirrors
from collector.store.run_file import RunConfig, RunFile, RunStore
from engine_hooks import Event
from engine_hooks.events import Evict, Free, Hit, Pool, Preempt, Store, unpack_counts, unpack_hashes
from tests.support.block_manager import make_hooks, make_manager, sample_engine_steps
from tests.support.repo import SAMPLE_TRACE

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version

SETTINGS = CacheSettings(block_size=16, num_blocks=300)
CONFIG = RunConfig("test", SETTINGS.block_size, SETTINGS.num_blocks, "sha256", "test")
EVERY_ROW = "SELECT * FROM {} ORDER BY ALL"


def two_engines() -> list[list[Event]]:
    """Per step, the records of two engines replaying the sample trace's first requests."""
    engines = [sample_engine_steps(SETTINGS, 120, "a"), sample_engine_steps(SETTINGS, 100, "b")]
    steps = []
    for _ in itertools.count():
        taken = [record for engine in engines for record in next(engine, [])]
        if not taken:
            return steps
        steps.append(taken)
    return steps


def store_steps(run: Path, steps: list[list[Event]], resume_every: int | None) -> None:
    store = RunStore.create(run, CONFIG)
    for number, records in enumerate(steps):
        store.append(records)
        if resume_every and number % resume_every == resume_every - 1:
            store.flush()  # as a collector commits each batch before acknowledging it
            store.close()
            store = RunStore.resume(run)  # the mirrors start again from the file's rows
    store.finalize()
    store.close()


def test_a_resumed_collector_derives_what_an_unbroken_one_does(tmp_path: Path) -> None:
    steps = two_engines()
    store_steps(tmp_path / "unbroken.duckdb", steps, resume_every=None)
    store_steps(tmp_path / "resumed.duckdb", steps, resume_every=7)
    with (
        RunFile.open(tmp_path / "unbroken.duckdb") as unbroken,
        RunFile.open(tmp_path / "resumed.duckdb") as resumed,
    ):
        for table in ("events", "pool"):
            assert resumed.rows(EVERY_ROW.format(table)) == unbroken.rows(EVERY_ROW.format(table))
        evictions = unbroken.row("SELECT count(*) FROM events WHERE kind = 'evict'")
        cached_free = unbroken.row("SELECT max(num_cached_free) FROM pool")
    assert evictions and evictions[0] > 1_000, "blocks cached before a resume get evicted"
    assert cached_free and cached_free[0] > 100


def test_lost_records_keep_counts_in_bounds_and_invent_no_hash(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path / "run.duckdb", CONFIG)
    seen_hashes: set[bytes] = set()  # stored or hit
    evicted_hashes: set[bytes] = set()
    pools: list[Pool] = []
    for records in two_engines():
        kept = [record for record in records if record.seq % 7]  # every seventh is lost
        for record in store.append(kept):
            if isinstance(record, Store | Hit):
                seen_hashes.update(unpack_hashes(record))
            elif isinstance(record, Evict):
                evicted_hashes.update(unpack_hashes(record))
            elif isinstance(record, Pool):
                pools.append(record)
    store.close()
    assert len(evicted_hashes) > 500
    assert evicted_hashes <= seen_hashes
    assert all(
        record.num_cached_free is not None and 0 <= record.num_cached_free <= record.num_free
        for record in pools
    )
    assert any(record.num_cached_free for record in pools)


def test_the_mirror_counts_references_as_vllm_does() -> None:
    """A dense layout's `Free` comes without reference counts (events.Free); the mirror's
    counts are vLLM's own, read off the blocks after every free, with requests sharing
    blocks and preempted in a pool too small for them all."""
    manager, block_hasher = make_manager(block_size=16, num_blocks=160)
    hooks, buffer = make_hooks(manager, clock := VirtualClock())
    simulator = Simulator(manager, hooks.attach(), clock, block_hasher, lambda: None)
    hooked_free_blocks = manager.block_pool.free_blocks
    vllm_counts: list[list[int]] = []

    def free_blocks(ordered_blocks: Iterable[Any]) -> None:
        blocks = list(ordered_blocks)
        hooked_free_blocks(blocks)
        if blocks:
            vllm_counts.append([block.ref_cnt for block in blocks])

    manager.block_pool.free_blocks = free_blocks
    simulator.run_timestamps(read_trace(SAMPLE_TRACE)[:150], 16, StepModel(), lambda _: None)
    records = buffer.take()
    frees = [record for record in records if isinstance(record, Free)]
    assert all(record.ref_cnts is None for record in frees)
    CacheMirrors(160).complete(records)
    counted = [unpack_counts(record.ref_cnts or b"") for record in frees]
    assert counted == vllm_counts
    assert any(count > 0 for counts in counted for count in counts), "blocks shared at a free"
    assert any(isinstance(record, Preempt) for record in records)
