"""Figures in a time window, and over time, read from the rollups of a small real run."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.queries import activity
from collector.queries.timeline import time_grid
from collector.store.run_file import RunFile
from tests.support.runs import shared_prefix_run


@pytest.fixture
def run_file(tmp_path: Path) -> RunFile:
    return RunFile.open(shared_prefix_run(tmp_path))


def test_window_figures(run_file: RunFile) -> None:
    # Buckets 200-400: b0 (8 of 12 tokens hit) and a1 (4 of 8).
    figures = activity.window_figures(run_file, time_grid(run_file).buckets(200, 400))
    assert figures == {
        "requests": 2,
        "prompt_tokens": 20,
        "hit_tokens": 12,
        "tier_hit_tokens": 0,
        "hit_tokens_squared": 80,
        "prompt_tokens_squared": 12**2 + 8**2,
        "prompt_blocks": 5,
        "hit_blocks": 3,
        "block_hits": 3,
        "stores": 2,
        "evictions": 0,
        "preemptions": 0,
        "resets": 0,
        "collisions": 0,
        "dropped_events": 0,
        "events": 20 + 4,  # b0: 11 event rows, a1: 9, and 2 pool rows each
        "token_hit_ratio": 12 / 20,
        "block_hit_ratio": 3 / 5,
    }


def test_figures_over_time(run_file: RunFile) -> None:
    # 601 buckets in at most 200 points: 4 buckets a point; each request in its own point.
    points = activity.figures_over_time(run_file, time_grid(run_file).whole_run(), 200)
    table = points[["t_s", "requests", "hit_tokens", "stores", "evictions", "cached_blocks"]]
    assert table.to_dict("records") == [
        {"t_s": 0.0, "requests": 1, "hit_tokens": 0, "stores": 2, "evictions": 0,
         "cached_blocks": 2},
        {"t_s": 0.01, "requests": 1, "hit_tokens": 8, "stores": 1, "evictions": 0,
         "cached_blocks": 3},
        {"t_s": 0.02, "requests": 1, "hit_tokens": 4, "stores": 1, "evictions": 0,
         "cached_blocks": 4},
        {"t_s": 0.03, "requests": 1, "hit_tokens": 0, "stores": 2, "evictions": 1,
         "cached_blocks": 5},
    ]  # fmt: skip


def test_points_are_whole_buckets(run_file: RunFile) -> None:
    # Buckets 100-500 in 2 points of 201 buckets: 100-300 (b0) and 301-500 (a1).
    window = time_grid(run_file).buckets(100, 500)
    points = activity.figures_over_time(run_file, window, max_points=2)
    assert points["width_s"].tolist() == pytest.approx([0.01005] * 2)  # one width, 201 buckets
    assert points[["t_s", "requests"]].to_dict("records") == [
        {"t_s": 0.005, "requests": 1},
        {"t_s": 0.01505, "requests": 1},
    ]
    # Cached blocks count from the start of the run, not of the window.
    assert points["cached_blocks"].tolist() == [3, 4]
