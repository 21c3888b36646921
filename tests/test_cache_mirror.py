"""The collector's mirror of each engine's cache (`collector/store/cache_mirror.py`): a
collector resumed on its run file derives what an unbroken one does, and records lost on
the way never push its counts out of bounds or invent a hash."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from collector.replay.block_manager import CacheSettings
from collector.store.run_file import RunConfig, RunFile, RunStore
from engine_hooks import Event
from engine_hooks.events import Evict, Hit, Pool, Store, unpack_hashes
from tests.support.block_manager import sample_engine_steps

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
