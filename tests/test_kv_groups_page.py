"""The KV cache groups page on the hybrid sample run (gpt-oss's shape: a full-attention and a
128-token sliding-window group): each group's figures, counted from the run's own rows, and
the blocks each held over time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.queries import kv_groups
from collector.store.run_file import RunFile
from tests.support.app import go_to, metrics, start
from tests.support.browser import app_server, chromium, png_is_not_blank, screenshot_page
from tests.support.repo import REPO, SAMPLE_HYBRID_RUN

PAGE = "views/kv_groups.py"


def test_each_groups_figures_are_its_own_rows() -> None:
    with RunFile.open(SAMPLE_HYBRID_RUN) as run:
        figures = kv_groups.group_figures(run)
        counted = dict(
            run.rows(
                "SELECT kind::VARCHAR || '/' || kv_group, count(*) FROM events "
                "WHERE kind IN ('store', 'hit', 'evict') GROUP BY ALL"
            )
        )
        peaks = run.rows(
            "SELECT max(num_in_use_by_group[1]), max(num_in_use_by_group[2]), max(num_in_use) "
            "FROM pool"
        )[0]
        timeline = kv_groups.in_use_timeline(run)
    assert list(figures["kind"]) == ["full attention", "sliding window of 128 tokens"]
    for group in (0, 1):
        row = figures.iloc[group]
        assert row["stored"] == counted[f"store/{group}"]
        assert row["block_hits"] == counted[f"hit/{group}"]
        assert row["evicted"] == counted[f"evict/{group}"]
        assert row["peak_in_use"] == peaks[group]
    # A window group reuses only its window's blocks; full attention reuses from block 0.
    assert figures["mean_hit_start"][0] == 0 and figures["mean_hit_start"][1] > 0
    assert figures["block_hits"][0] > figures["block_hits"][1]
    assert 0 < peaks[1] < peaks[0] <= peaks[2] <= 1499
    assert set(timeline["kv_group"]) == {0, 1} and timeline["in_use"].max() == peaks[0]


def test_the_page_shows_both_groups_and_the_blocks_each_held() -> None:
    app = go_to(start(SAMPLE_HYBRID_RUN), PAGE)
    shown = metrics(app)
    assert shown["Groups"] == "2"
    assert shown["Holds the most blocks"] == "group 0: full attention"
    table = app.dataframe[0].value
    assert list(table["attention"]) == ["full attention", "sliding window of 128 tokens"]
    (chart,) = app.get("plotly_chart")
    names = [trace["name"] for trace in json.loads(chart.proto.spec)["data"]]
    assert names == ["group 0: full attention", "group 1: sliding window of 128 tokens"]
    assert not app.info  # the one-group note is for runs of one group


def test_the_run_options_say_the_layout_it_was_replayed_with() -> None:
    with RunFile.open(SAMPLE_HYBRID_RUN) as run:
        assert kv_groups.layout(run) == [
            {"kind": "full", "block_size": 16, "window": 0, "num_layers": 1},
            {"kind": "sliding_window", "block_size": 16, "window": 128, "num_layers": 1},
        ]


@pytest.mark.slow
def test_screenshot_of_the_page(tmp_path: Path) -> None:
    with app_server(REPO, "--db", str(SAMPLE_HYBRID_RUN)) as url, chromium() as driver:
        path = tmp_path / "kv_groups.png"
        seen = screenshot_page(driver, f"{url}/kv_groups", path, 1)
    assert seen["exceptions"] == [] and seen["charts"] >= 1, seen
    assert png_is_not_blank(path)
