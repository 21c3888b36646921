"""Eviction ages and hits-while-cached, which the collector derives from the stored stream,
equal what a reader of the records in order would count, also across live refreshes."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.replay.block_manager import CacheSettings, make_block_hasher, make_kv_cache_manager
from collector.replay.simulator import Simulator, VirtualClock
from collector.replay.traces import read_trace
from collector.store.run_file import RunConfig, RunFile, RunStore
from engine_hooks import Event, EventBuffer, KVCacheHooks, Pseudonymizer
from engine_hooks.events import Evict, Hit, Store
from tests.support.repo import SAMPLE_TRACE

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version

SETTINGS = CacheSettings(block_size=16, num_blocks=300)


def ages_by_reading_the_records(records: list[Event]) -> dict[tuple[int, int], tuple[int, int]]:
    """(seq, pos) of each evicted block -> (ns since its store, hits since its store)."""
    stored_ns: dict[int, int] = {}
    hits: dict[int, int] = {}
    expected: dict[tuple[int, int], tuple[int, int]] = {}
    for record in records:
        if isinstance(record, Store):
            for block_id in record.block_ids:
                stored_ns[block_id] = record.ts_ns
                hits[block_id] = 0
        elif isinstance(record, Hit):
            for block_id in record.block_ids:
                hits[block_id] += 1
        elif isinstance(record, Evict):
            for pos, block_id in enumerate(record.block_ids):
                expected[record.seq, pos] = (record.ts_ns - stored_ns[block_id], hits[block_id])
    return expected


def test_derived_eviction_ages_match_the_record_stream(tmp_path: Path) -> None:
    requests = read_trace(SAMPLE_TRACE)[:150]
    manager = make_kv_cache_manager(SETTINGS)
    buffer = EventBuffer()
    clock = VirtualClock()
    hooks = KVCacheHooks(manager, buffer, pseudonymizer=Pseudonymizer(b"t"), clock=clock)
    config = RunConfig("test", SETTINGS.block_size, SETTINGS.num_blocks, "sha256", "test")
    store = RunStore.create(tmp_path / "run.duckdb", config)
    records: list[Event] = []

    def drain() -> None:
        taken = buffer.take()
        records.extend(taken)
        store.append(taken)

    simulator = Simulator(manager, hooks.attach(), clock, make_block_hasher(SETTINGS), drain)
    simulator.run_sequential(requests[:75], lambda _: None)
    store.refresh_derived()  # as a live run does: the first evictions get their ages now
    simulator.run_sequential(requests[75:], lambda _: None)
    hooks.detach()
    store.finalize()
    store.close()

    expected = ages_by_reading_the_records(records)
    with RunFile.open(tmp_path / "run.duckdb") as run_file:
        rows = run_file.rows("SELECT seq, pos, age_ns, num_hits FROM events WHERE kind = 'evict'")
    derived = {(seq, pos): (age_ns, num_hits) for seq, pos, age_ns, num_hits in rows}
    assert derived == expected
    assert len(derived) > 500
    assert sum(1 for _, num_hits in derived.values() if num_hits) > 50
