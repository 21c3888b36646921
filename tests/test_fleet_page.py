"""The Fleet page (visualizer/views/fleet.py) and its queries (collector/queries/fleet.py): a
hand-built run of two engines with answers worked out by hand, the page drawn on it, and the
note a run of one engine gets.

FLEET (block size 4, ten blocks: nine usable; times in ms):
  engine a  t=0   a0 looks up 8 tokens, no hit; stores H1 (block 1), H2 (block 2)
            t=30  takes block 1 again: evicts H1
  engine b  t=10  b0 looks up 8 tokens, no hit; stores H1 (block 5)
            t=20  b1 looks up 8 tokens, hits H1 (4 tokens); stores H2 (block 6)
            t=40  resets its cache
So H1 is on both engines over 10-30 ms and H2 over 20-40 ms: extra copies 0 (0-10), 1
(10-20), 2 (20-30), 1 (30-40), 0 (40-50); cached copies 2, 3, 4, 3, 1. Pool snapshots: a at
0 (7 free of 9), 30 (none free: under 10 %) and 50 (8 free); b at 10 (8 free) and 40 (9 free).
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import pytest

from collector.model.kv_memory import MODELS, gib_for_blocks
from collector.queries import fleet
from collector.replay.block_manager import CacheSettings
from collector.store.run_file import RunConfig, RunFile, RunStore
from engine_hooks.events import Allocate, Event, Hit, Lookup, Pool, Reset, Store, pack_counts
from tests.support.app import go_to, metrics, start
from tests.support.block_manager import sample_engine_steps

PAGE = "views/fleet.py"
MS = 1_000_000
H1, H2 = (1).to_bytes(8, "big"), (2).to_bytes(8, "big")


def engine_a() -> list[Event]:
    return [
        Lookup(0, 0, "a0", 8, 0, 0, False),
        Store(1, 0, "a0", pack_counts([1, 2]), H1 + H2, None, 0, 4),
        Pool(2, 0, None, 7, None, 2),
        Allocate(3, 30 * MS, "a1", pack_counts([1])),
        Pool(4, 30 * MS, None, 0, None, 9),
        Pool(5, 50 * MS, None, 8, None, 1),
    ]


def engine_b() -> list[Event]:
    return [
        Lookup(0, 10 * MS, "b0", 8, 0, 0, False),
        Store(1, 10 * MS, "b0", pack_counts([5]), H1, None, 0, 4),
        Pool(2, 10 * MS, None, 8, None, 1),
        Hit(3, 20 * MS, "b1", pack_counts([5]), H1),
        Lookup(4, 20 * MS, "b1", 8, 4, 1, False),
        Store(5, 20 * MS, "b1", pack_counts([6]), H2, H1, 1, 4),
        Reset(6, 40 * MS, None, None),
        Pool(7, 40 * MS, None, 9, None, 0),
    ]


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fleet") / "run.duckdb"
    store = RunStore.create(path, RunConfig("test", 4, 10, "sha256", "test"))
    for engine_id, records in (("a", engine_a()), ("b", engine_b())):
        for record in records:
            record.engine_id = engine_id
        store.append(records)
    store.finalize()
    store.close()
    return path


def test_each_engines_load_hits_and_pool_pressure(fleet_run: Path) -> None:
    with RunFile.open(fleet_run) as run:
        assert fleet.num_engines(run) == 2
        engines = fleet.fleet_engines(run)
    assert engines.drop(columns=["min_free_share", "low_free_time_share"]).to_dict("records") == [
        {
            "engine_id": "a",
            "dp_rank": 0,
            "requests": 1,
            "prompt_tokens": 8,
            "hit_tokens": 0,
            "hit_ratio": 0.0,
            "evictions": 1,
            "engine": "a",
        },
        {
            "engine_id": "b",
            "dp_rank": 0,
            "requests": 2,
            "prompt_tokens": 16,
            "hit_tokens": 4,
            "hit_ratio": 0.25,
            "evictions": 0,
            "engine": "b",
        },
    ]
    assert list(engines["min_free_share"]) == pytest.approx([0.0, 8 / 9])
    # a: 30 ms at 7 free, 20 ms at none free (low), then its last step; b never low.
    assert list(engines["low_free_time_share"]) == pytest.approx([20 / 50, 0.0])
    assert fleet.load_imbalance(engines) == pytest.approx(
        {"requests": 2 / 1.5, "prompt_tokens": 16 / 12}
    )


def test_an_engine_with_dp_ranks_names_each_rank() -> None:
    engine_ids = ["a", "a", "b", "", "c"]
    assert fleet.engine_labels(engine_ids, [0, 1, 0, 0, 0]) == [
        "a dp0",
        "a dp1",
        "b",
        "(unnamed)",
        "c",
    ]


def test_blocks_cached_on_both_engines_over_time(fleet_run: Path) -> None:
    with RunFile.open(fleet_run) as run:
        # 10 ms buckets; the last one is the run's final nanosecond.
        over_time = fleet.fleet_duplication(run, gib_per_block=0.5, max_points=5)
        summary = fleet.duplication_summary(run, gib_per_block=0.5)
    assert list(over_time["t_s"]) == pytest.approx([0, 0.01, 0.02, 0.03, 0.04, 0.05])
    assert list(over_time["duplicated_hashes"]) == [0, 1, 2, 1, 0, 0]
    assert list(over_time["duplicated_blocks"]) == [0, 1, 2, 1, 0, 0]
    assert list(over_time["duplicated_gib"]) == [0, 0.5, 1.0, 0.5, 0, 0]
    assert list(over_time["mean_duplicated_blocks"]) == pytest.approx([0, 1, 2, 1, 0, 0])
    assert list(over_time["mean_cached_blocks"]) == pytest.approx([2, 3, 4, 3, 1, 1])
    span_ns = 50 * MS + 1  # the run's first record to just past its last
    assert summary == pytest.approx(
        {
            "peak_duplicated_blocks": 2,
            "peak_share": 2 / 4,
            "mean_duplicated_blocks": 40 * MS / span_ns,
            "mean_share": 40 / (130 + 1 / MS),
            "peak_duplicated_gib": 1.0,
            "mean_duplicated_gib": 0.5 * 40 * MS / span_ns,
        }
    )


def test_the_page_shows_the_fleet(fleet_run: Path) -> None:
    app = go_to(start(fleet_run), PAGE)
    shown = metrics(app)
    assert shown["Engines"] == "2"
    assert shown["Fleet hit ratio (tokens)"] == f"{4 / 24:.1%}"
    assert shown["Load imbalance (requests)"] == "1.33x"
    # 2 blocks of 4 tokens at the default KV spec (llama-3.1-8b, bfloat16)
    assert shown["Peak duplicated"] == f"{gib_for_blocks(MODELS['llama-3.1-8b'], 4, 2):.3g} GiB"
    charts = [json.loads(chart.proto.spec) for chart in app.get("plotly_chart")]
    assert [len(chart["data"]) for chart in charts] == [1, 1, 2, 2]
    assert [trace["name"] for trace in charts[2]["data"]] == ["a", "b"]
    assert list(app.dataframe[0].value["engine"]) == ["a", "b"]
    assert not app.info


def test_the_overview_names_each_engines_pool(fleet_run: Path) -> None:
    caption = start(fleet_run).caption[0].value
    assert "block size 4, 2 engines of 10 blocks each, sha256" in caption


def test_a_run_of_one_engine_gets_a_note() -> None:
    app = go_to(start(), PAGE)
    assert not app.get("plotly_chart")
    assert "needs a run with several engines" in app.info[0].value


@pytest.mark.vllm
def test_duplication_is_what_replaying_the_stores_gives(tmp_path: Path) -> None:
    """Two engines through vLLM's real manager, against the cache rebuilt record by record."""
    settings = CacheSettings(block_size=16, num_blocks=300)
    store = RunStore.create(tmp_path / "run.duckdb", RunConfig("test", 16, 300, "sha256", "t"))
    engines = [
        list(sample_engine_steps(settings, num, name)) for name, num in (("a", 60), ("b", 40))
    ]
    for number in range(max(map(len, engines))):
        store.append(
            [record for steps in engines if number < len(steps) for record in steps[number]]
        )
    store.finalize()
    store.close()
    with RunFile.open(tmp_path / "run.duckdb") as run:
        summary = fleet.duplication_summary(run, gib_per_block=1.0)
        rows = run.rows(
            "SELECT ts_ns, engine_id, kind::VARCHAR, block_id, block_hash FROM events "
            "WHERE kind IN ('store', 'evict') ORDER BY ts_ns, engine_id, seq"
        )
    cached: dict[tuple[str, int], int] = {}  # (engine, block id) -> hash
    extra_copies = []
    for _, moment in itertools.groupby(rows, key=lambda row: row[0]):
        for _, engine_id, kind, block_id, block_hash in moment:
            if kind == "store":
                cached[engine_id, block_id] = block_hash
            else:
                cached.pop((engine_id, block_id), None)
        held = {(engine_id, block_hash) for (engine_id, _), block_hash in cached.items()}
        engines_per_hash = Counter(block_hash for _, block_hash in held)
        extra_copies.append(sum(count - 1 for count in engines_per_hash.values()))
    assert summary["peak_duplicated_blocks"] == max(extra_copies) > 0
    assert 0 < summary["mean_duplicated_blocks"] < max(extra_copies)
