"""Eviction ages and hits-while-cached, which the collector derives from the stored stream,
equal what a reader of the records in order would count: across many live refreshes, with
several engines, with records lost, for a collector resumed on its file, and for an engine
that numbers its records from 0 again."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from collector.replay.block_manager import CacheSettings
from collector.store.run_file import RunConfig, RunFile, RunStore
from engine_hooks import Event
from engine_hooks.events import Evict, Hit, Store, pack_counts, unpack_counts
from tests.support.block_manager import sample_engine_steps

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version

SETTINGS = CacheSettings(block_size=16, num_blocks=300)
HASH_OF_7 = bytes(range(8))
CONFIG = RunConfig("test", SETTINGS.block_size, SETTINGS.num_blocks, "sha256", "test")

Eviction = tuple[str, int, int, int]  # engine, DP rank, record number, position
Derived = dict[Eviction, tuple[int | None, int | None]]


def ages_by_reading_the_records(records: list[Event]) -> Derived:
    """Each evicted block -> (ns since its store, hits since its store), both None when no
    store of it was recorded."""
    stored_ns: dict[tuple[str, int, int], int] = {}
    hits: dict[tuple[str, int, int], int] = {}
    expected: Derived = {}
    for record in records:
        engine = (record.engine_id, record.dp_rank)
        if isinstance(record, Store):
            for block_id in unpack_counts(record.block_ids):
                stored_ns[*engine, block_id] = record.ts_ns
                hits[*engine, block_id] = 0
        elif isinstance(record, Hit):
            for block_id in unpack_counts(record.block_ids):
                hits[*engine, block_id] = hits.get((*engine, block_id), 0) + 1
        elif isinstance(record, Evict):
            for pos, block_id in enumerate(unpack_counts(record.block_ids)):
                block = (*engine, block_id)
                known = block in stored_ns
                expected[*engine, record.seq, pos] = (
                    record.ts_ns - stored_ns[block] if known else None,
                    hits[block] if known else None,
                )
    return expected


def derived_ages(run: Path) -> Derived:
    with RunFile.open(run) as run_file:
        rows = run_file.rows(
            "SELECT engine_id, dp_rank, seq, pos, age_ns, num_hits FROM events WHERE kind = 'evict'"
        )
    return {
        (engine or "", rank or 0, seq, pos): (age, hits)
        for engine, rank, seq, pos, age, hits in rows
    }


def test_derived_eviction_ages_match_the_record_stream_across_refreshes(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path / "run.duckdb", CONFIG)
    records: list[Event] = []
    window_of_store: dict[int, int] = {}  # block id -> the refresh window of its last store
    evicted_in: dict[str, int] = {"the store's window": 0, "a later window": 0}
    for step, taken in enumerate(sample_engine_steps(SETTINGS, 150)):
        window = step // 23
        completed = store.append(taken)  # with the evictions the collector derives
        for record in completed:
            if isinstance(record, Store):
                window_of_store.update(dict.fromkeys(unpack_counts(record.block_ids), window))
            elif isinstance(record, Evict):
                for block_id in unpack_counts(record.block_ids):
                    later = window_of_store[block_id] < window
                    evicted_in["a later window" if later else "the store's window"] += 1
        records.extend(completed)
        if step % 23 == 22:
            store.refresh_derived()  # as a live run does, every few steps
    store.finalize()
    store.close()

    derived = derived_ages(tmp_path / "run.duckdb")
    assert derived == ages_by_reading_the_records(records)
    assert len(derived) > 500
    assert sum(1 for _, num_hits in derived.values() if num_hits) > 50
    assert min(evicted_in.values()) > 50, evicted_in


def test_engines_lost_records_and_a_resumed_collector(tmp_path: Path) -> None:
    run = tmp_path / "run.duckdb"
    store = RunStore.create(run, CONFIG)
    engines = [
        sample_engine_steps(SETTINGS, 120, "a"),
        sample_engine_steps(SETTINGS, 120, "a", dp_rank=1),
        sample_engine_steps(SETTINGS, 90, "b"),
    ]
    stored: list[Event] = []
    for step in itertools.count():
        taken = [record for engine in engines for record in next(engine, [])]
        if not taken:
            break
        kept = [record for record in taken if record.engine_id != "b" or record.seq % 4]
        # Every fourth of engine b's records is lost on the way (among them stores of blocks
        # that are evicted later: those evictions have no known age).
        stored.extend(store.append(kept))
        if step % 5 == 4:
            store.refresh_derived()
        if step == 52:  # the collector dies; another one goes on with the file
            store.flush()  # as a collector commits each batch before acknowledging it
            store.close()
            store = RunStore.resume(run)
    store.finalize()
    store.close()

    derived = derived_ages(run)
    assert derived == ages_by_reading_the_records(stored)
    assert {engine for engine, *_ in derived} == {"a", "b"}
    assert {(engine, rank) for engine, rank, *_ in derived} == {("a", 0), ("a", 1), ("b", 0)}
    unknown = [eviction for eviction, (age, _) in derived.items() if age is None]
    assert unknown and all(engine == "b" for engine, *_ in unknown)


def test_an_engine_numbering_its_records_from_0_again(tmp_path: Path) -> None:
    """A restarted engine under the same id: ages follow record numbers, as if derived from
    all the rows at each refresh, whatever was folded in before."""
    run = tmp_path / "run.duckdb"
    store = RunStore.create(run, CONFIG)
    store.append([store_of_7(10, 1_000), hit_of_7(11, 1_100)])
    store.refresh_derived()
    store.append([store_of_7(1, 5_000), hit_of_7(2, 5_100), evict_of_7(3, 5_500)])
    store.refresh_derived()
    store.append([hit_of_7(12, 6_000), evict_of_7(13, 6_500)])
    store.finalize()
    store.close()

    # Record 3's latest store is record 1; record 13's is record 10, hit by 11 and 12.
    assert derived_ages(run) == {("e", 0, 3, 0): (500, 1), ("e", 0, 13, 0): (5_500, 2)}


def store_of_7(seq: int, ts_ns: int) -> Store:
    return Store(seq, ts_ns, "r", pack_counts([7]), HASH_OF_7, None, 0, 16, engine_id="e")


def hit_of_7(seq: int, ts_ns: int) -> Hit:
    return Hit(seq, ts_ns, "r", pack_counts([7]), HASH_OF_7, engine_id="e")


def evict_of_7(seq: int, ts_ns: int) -> Evict:
    return Evict(seq, ts_ns, "r", pack_counts([7]), HASH_OF_7, engine_id="e")
