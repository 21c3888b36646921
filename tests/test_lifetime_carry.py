"""The cache lifetimes a live copy carries over from the copy before it
(collector/store/lifetime_carry.py) equal those built from every event row: copy after copy
while two engines run, across evictions and a cache reset; and a copy whose new rows do not
follow on from the copy before builds them whole."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest

from collector.replay.block_manager import CacheSettings
from collector.store import live_copy
from collector.store.live_copy import LiveCopy
from collector.store.run_file import RunConfig, RunFile, RunStore
from engine_hooks import Event
from engine_hooks.events import Reset
from tests.support.block_manager import sample_engine_steps

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version

SETTINGS = CacheSettings(block_size=16, num_blocks=120)  # small: blocks are evicted and reused
CONFIG = RunConfig("test", SETTINGS.block_size, SETTINGS.num_blocks, "sha256", "test")
COLUMNS = "* EXCLUDE (ended_ns), ended_ns"


def two_engines(num_requests: int) -> list[list[Event]]:
    """Two engines' steps, interleaved, and a cache reset on engine "a" a third of the way
    (numbered as the step's last record, so the blocks that step stored stay cached)."""
    engine_a = list(sample_engine_steps(SETTINGS, num_requests, "a"))
    last = engine_a[len(engine_a) // 3][-1]
    engine_a[len(engine_a) // 3].append(Reset(last.seq, last.ts_ns, None, None, engine_id="a"))
    engine_b = sample_engine_steps(SETTINGS, num_requests, "b")
    return [step for pair in itertools.zip_longest(engine_a, engine_b) for step in pair if step]


def whole_lifetimes(copy: Path, scratch: Path) -> set[tuple[object, ...]]:
    """The copy's lifetimes built again from every event row, in a copy of its own."""
    shutil.copy(copy, scratch)
    with RunStore.open_copy(scratch) as store:
        dict(store.rebuild_steps())["cache_lifetimes"]()
        rows = store.rows(f"SELECT {COLUMNS} FROM cache_lifetimes")
    scratch.unlink()
    return multiset(rows)


def published_lifetimes(copy: Path) -> set[tuple[object, ...]]:
    with RunFile.open(copy) as run:
        return multiset(run.rows(f"SELECT {COLUMNS} FROM cache_lifetimes"))


def multiset(rows: list[tuple[object, ...]]) -> set[tuple[object, ...]]:
    counted = {row: rows.count(row) for row in rows}
    return {(*row, count) for row, count in counted.items()}


def publish(live: LiveCopy) -> None:
    assert live.publish()
    live.wait()
    assert live.failures == []


@pytest.fixture(autouse=True)
def copy_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make a copy whenever the test asks, however long the last one took."""
    monkeypatch.setattr(live_copy, "PUBLISH_ALWAYS_S", float("inf"))


def test_copy_after_copy_the_carried_lifetimes_equal_the_whole_ones(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path / "run.duckdb", CONFIG)
    live = LiveCopy(store, threads=1, memory_limit="1GB")
    steps = two_engines(60)
    size = len(steps) // 5 + 1
    pieces = [steps[start : start + size] for start in range(0, len(steps), size)]
    endings = []
    for piece in pieces:
        for records in piece:
            store.append(records)
        publish(live)
        carried = published_lifetimes(live.path)
        assert carried == whole_lifetimes(live.path, tmp_path / "whole.duckdb")
        endings.append({row[7] for row in carried})  # ended_by
    assert live.published == len(pieces) and live.carried == len(pieces) - 1
    assert {"evict", "reset", None} <= set().union(*endings), "lifetimes of every ending"
    live.close()
    store.finalize()
    store.close()
    with RunFile.open(store.path) as run:
        row = run.row("SELECT sum(hits) FROM cache_lifetimes WHERE engine = 'b'")
        hits = run.row("SELECT count(*) FROM events WHERE kind = 'hit' AND engine_id = 'b'")
    assert row is not None and hits is not None
    # (Engine "a" hits blocks its made-up reset dropped: those go to no lifetime.)
    assert row[0] == hits[0], "every hit of engine b went to a lifetime"


def test_an_engine_numbering_its_records_again_gets_lifetimes_built_whole(
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
    assert published_lifetimes(live.path) == whole_lifetimes(live.path, tmp_path / "w.duckdb")
    for records in sample_engine_steps(SETTINGS, 10, "b"):  # a new engine follows on
        store.append(records)
    publish(live)
    assert live.carried == 1
    assert published_lifetimes(live.path) == whole_lifetimes(live.path, tmp_path / "w.duckdb")
    live.close()
    store.finalize()
    store.close()
