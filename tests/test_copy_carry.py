"""The tables a live copy carries over from the copy before it (collector/store/copy_carry.py)
equal those built from every event row: copy after copy while two engines run (their
clocks apart), across evictions and a cache reset, with the time grid fixed (every copy
carried) and growing (a copy where it coarsened is built whole); and a copy whose new rows
do not follow on from the copy before builds them whole."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from collector.replay.block_manager import CacheSettings
from collector.store import live_copy
from collector.store.live_copy import LiveCopy
from collector.store.run_file import RunConfig, RunFile, RunStore
from engine_hooks import Event
from engine_hooks.events import Pool, Reset
from tests.support.block_manager import sample_engine_steps
from tests.support.carried_tables import published_tables, whole_tables

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version

SETTINGS = CacheSettings(block_size=16, num_blocks=120)  # small: blocks are evicted and reused
CONFIG = RunConfig("test", SETTINGS.block_size, SETTINGS.num_blocks, "sha256", "test")


def two_engines(num_requests: int) -> list[list[Event]]:
    """Two engines' steps, interleaved, and a cache reset on engine "a" a third of the way
    (numbered as the step's last record, so the blocks that step stored stay cached)."""
    engine_a = list(sample_engine_steps(SETTINGS, num_requests, "a"))
    last = engine_a[len(engine_a) // 3][-1]
    engine_a[len(engine_a) // 3].append(Reset(last.seq, last.ts_ns, None, None, engine_id="a"))
    engine_b = sample_engine_steps(SETTINGS, num_requests, "b")
    return [step for pair in itertools.zip_longest(engine_a, engine_b) for step in pair if step]


def publish(live: LiveCopy) -> None:
    assert live.publish()
    live.wait()
    assert live.failures == []


@pytest.fixture(autouse=True)
def copy_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make a copy whenever the test asks, however long the last one took."""
    monkeypatch.setattr(live_copy, "PUBLISH_ALWAYS_S", float("inf"))


@pytest.mark.parametrize("grid", ["fixed", "growing"])
def test_copy_after_copy_the_carried_tables_equal_the_whole_ones(tmp_path: Path, grid: str) -> None:
    store = RunStore.create(tmp_path / "run.duckdb", CONFIG)
    live = LiveCopy(store, threads=1, memory_limit="1GB")
    if grid == "fixed":  # a pool record long after the run: every copy has the same grid
        store.append([Pool(0, 10**15, None, 0, None, 0, engine_id="clock")])
    steps = two_engines(60)
    size = len(steps) // 5 + 1
    pieces = [steps[start : start + size] for start in range(0, len(steps), size)]
    for piece in pieces:
        for records in piece:
            store.append(records)
        carried_before = live.carried
        publish(live)
        note, tables = published_tables(live.path)
        assert note == ("carried" if live.carried > carried_before else "whole")
        assert tables == whole_tables(live.path, tmp_path / "whole.duckdb")
    print(f"{live.carried} of {len(pieces)} copies carried")
    assert live.published == len(pieces)
    if grid == "fixed":
        assert live.carried == len(pieces) - 1
    else:
        assert 0 < live.carried < len(pieces) - 1, "some copies carried, some built whole"
    with RunFile.open(live.path) as run:
        endings = run.rows("SELECT DISTINCT ended_by FROM cache_lifetimes")
        duplicated = run.row("SELECT max(duplicated_blocks) FROM fleet_states")
        shared = run.row("SELECT sum(block_hits) FROM tenant_sharing")
        hits = run.row("SELECT count(*) FROM events WHERE kind = 'hit'")
    assert {"evict", "reset", None} <= {ending for (ending,) in endings}, "every ending"
    assert duplicated is not None and duplicated[0] > 0, "both engines cached the same blocks"
    assert shared is not None and hits is not None and shared[0] == hits[0] > 0
    live.close()
    store.finalize()
    store.close()
    with RunFile.open(store.path) as run:
        row = run.row("SELECT sum(hits) FROM cache_lifetimes WHERE engine = 'b'")
        hits = run.row("SELECT count(*) FROM events WHERE kind = 'hit' AND engine_id = 'b'")
    assert row is not None and hits is not None
    # (Engine "a" hits blocks its made-up reset dropped: those go to no lifetime.)
    assert row[0] == hits[0], "every hit of engine b went to a lifetime"


def test_an_engine_numbering_its_records_again_gets_its_tables_built_whole(
    tmp_path: Path,
) -> None:
    store = RunStore.create(tmp_path / "run.duckdb", CONFIG)
    live = LiveCopy(store, threads=1, memory_limit="1GB")
    for records in sample_engine_steps(SETTINGS, 30, "a"):
        store.append(records)
    publish(live)
    for records in sample_engine_steps(SETTINGS, 10, "a"):  # restarted: records from 0 again
        store.append(records)
    publish(live)
    assert live.carried == 0
    assert published_tables(live.path)[1] == whole_tables(live.path, tmp_path / "w.duckdb")
    for records in sample_engine_steps(SETTINGS, 10, "b"):  # a new engine follows on
        store.append(records)
    publish(live)
    assert live.carried == 1
    assert published_tables(live.path)[1] == whole_tables(live.path, tmp_path / "w.duckdb")
    live.close()
    store.finalize()
    store.close()


def test_a_copy_that_fails_to_carry_leaves_the_next_to_build_whole(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path / "run.duckdb", CONFIG)
    live = LiveCopy(store, threads=1, memory_limit="1GB")
    for records in sample_engine_steps(SETTINGS, 20, "a"):
        store.append(records)
    publish(live)
    live.path.write_bytes(b"not the copy before")  # what it carries from is gone
    store.append([Pool(10**6, 10**12, None, 0, None, 0, engine_id="a")])
    assert live.publish()
    live.wait()
    assert len(live.failures) == 1 and live.published == 1
    assert live.publish()
    live.wait()
    assert len(live.failures) == 1 and live.published == 2 and live.carried == 0
    assert published_tables(live.path)[1] == whole_tables(live.path, tmp_path / "w.duckdb")
    live.close()
    store.finalize()
    store.close()
