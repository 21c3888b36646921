"""Hotspot queries on a small real run (tests/support/runs.py), with exact rows."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from collector.queries import hotspots
from collector.queries.timeline import time_grid
from collector.store.run_file import RunFile
from tests.support.runs import hex_names, shared_prefix_run


@pytest.fixture
def run_file(tmp_path: Path) -> RunFile:
    return RunFile.open(shared_prefix_run(tmp_path))


def test_block_heatmap(run_file: RunFile) -> None:
    heat = hotspots.block_heatmap(run_file, time_grid(run_file).whole_run())
    assert heat.to_dict("records") == [
        {"t_s": 0.0, "block_start": 1, "hits": 0, "stores": 1, "evictions": 0},
        {"t_s": 0.0, "block_start": 2, "hits": 0, "stores": 1, "evictions": 0},
        {"t_s": 0.01, "block_start": 1, "hits": 1, "stores": 0, "evictions": 0},
        {"t_s": 0.01, "block_start": 2, "hits": 1, "stores": 0, "evictions": 0},
        {"t_s": 0.01, "block_start": 3, "hits": 0, "stores": 1, "evictions": 0},
        {"t_s": 0.02, "block_start": 1, "hits": 1, "stores": 0, "evictions": 0},
        {"t_s": 0.02, "block_start": 4, "hits": 0, "stores": 1, "evictions": 0},
        {"t_s": 0.03, "block_start": 3, "hits": 0, "stores": 1, "evictions": 1},
        {"t_s": 0.03, "block_start": 5, "hits": 0, "stores": 1, "evictions": 0},
    ]
    later = hotspots.block_heatmap(run_file, time_grid(run_file).buckets(500, 600))
    assert later[["t_s", "block_start", "evictions"]].to_dict("records") == [
        {"t_s": 0.03, "block_start": 3, "evictions": 1},
        {"t_s": 0.03, "block_start": 5, "evictions": 0},
    ]


def test_top_blocks(run_file: RunFile) -> None:
    names = hex_names(run_file)
    top = hotspots.top_blocks(run_file, time_grid(run_file).whole_run())
    assert top.to_dict("records") == [
        {"block_hash": names["A1"], "block_position": 0, "hits": 2, "stores": 1, "evictions": 0,
         "first_use_s": 0.0, "last_use_s": 0.02, "tenant": "a", "lora": None},
        {"block_hash": names["A2"], "block_position": 1, "hits": 1, "stores": 1, "evictions": 0,
         "first_use_s": 0.0, "last_use_s": 0.01, "tenant": "a", "lora": None},
    ]  # fmt: skip
    # Inside a window the figures are the window's: a1 hit A1 at 20 ms, nothing stored it.
    late = hotspots.top_blocks(run_file, time_grid(run_file).buckets(300, 600))
    assert late.to_dict("records") == [
        {"block_hash": names["A1"], "block_position": 0, "hits": 1, "stores": 0, "evictions": 0,
         "first_use_s": 0.02, "last_use_s": 0.02, "tenant": "a", "lora": None},
    ]  # fmt: skip


@pytest.mark.parametrize("measure", hotspots.HEAT_MEASURES)
def test_top_blocks_from_events_equal_the_rollup_over_the_whole_run(
    run_file: RunFile, measure: str
) -> None:
    window = time_grid(run_file).whole_run()
    from_rollup = hotspots.top_blocks(run_file, window, measure=measure)
    from_events = hotspots._top_blocks(
        run_file, hotspots._top_from_events(measure), window, 20, events=True
    )
    pd.testing.assert_frame_equal(from_rollup, from_events, check_dtype=False)


def test_most_stored_and_most_evicted_blocks(run_file: RunFile) -> None:
    names = hex_names(run_file)
    window = time_grid(run_file).whole_run()
    # c0 evicted B3; every block was stored once: by position, then hash.
    evicted = hotspots.top_blocks(run_file, window, measure="evictions")
    assert evicted[["block_hash", "evictions", "hits"]].to_dict("records") == [
        {"block_hash": names["B3"], "evictions": 1, "hits": 0}
    ]
    stored = hotspots.top_blocks(run_file, window, measure="stores")
    assert stored["stores"].tolist() == [1] * 6
    assert stored["block_position"].tolist() == sorted(stored["block_position"])
    with pytest.raises(ValueError, match="no such measure"):
        hotspots.top_blocks(run_file, window, measure="reads")


def test_hit_count_frequencies(run_file: RunFile) -> None:
    grid = time_grid(run_file)
    # Six blocks were cached: A1 was hit twice while cached, A2 once; B3, C2, S1, S2 never.
    whole = hotspots.hit_count_frequencies(run_file, grid.whole_run())
    assert whole.to_dict("records") == [
        {"hits": 0, "blocks": 4},
        {"hits": 1, "blocks": 1},
        {"hits": 2, "blocks": 1},
    ]
    # Cached in a0's bucket: A1 and A2, with all their hits (also those after the bucket).
    assert hotspots.hit_count_frequencies(run_file, grid.buckets(0, 0)).to_dict("records") == [
        {"hits": 1, "blocks": 1},
        {"hits": 2, "blocks": 1},
    ]
    # Cached in b0's bucket: B3, never hit before c0 evicted it.
    assert hotspots.hit_count_frequencies(run_file, grid.buckets(200, 200)).to_dict("records") == [
        {"hits": 0, "blocks": 1}
    ]


def test_histogram_and_skew() -> None:
    frequencies = pd.DataFrame({"hits": [0, 1, 2, 3, 4, 9], "blocks": [90, 4, 2, 1, 2, 1]})
    histogram = hotspots.hit_count_histogram(frequencies)
    assert histogram.to_dict("records") == [
        {"bin": "0", "low": 0, "high": 0, "blocks": 90, "hits": 0},
        {"bin": "1", "low": 1, "high": 1, "blocks": 4, "hits": 4},
        {"bin": "2", "low": 2, "high": 2, "blocks": 2, "hits": 4},
        {"bin": "3-4", "low": 3, "high": 4, "blocks": 3, "hits": 11},
        {"bin": "9-16", "low": 9, "high": 16, "blocks": 1, "hits": 9},
    ]
    # 100 hashes, 28 hits: the top 1 % (one hash) took 9, the top 10 % all 28.
    assert hotspots.reuse_skew(frequencies) == {
        "blocks": 100,
        "hits": 28,
        "top_1pct_hit_share": 9 / 28,
        "top_10pct_hit_share": 1.0,
        "never_hit_share": 0.9,
    }
