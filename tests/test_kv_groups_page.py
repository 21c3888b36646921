"""The KV cache groups page on the hybrid sample run (gpt-oss's shape: a full-attention and a
128-token sliding-window group): each group's figures, counted from the run's own rows, and
the blocks each held over time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.queries import hotspots, kv_groups
from collector.queries.timeline import time_grid
from collector.store.run_file import RunFile
from engine_hooks.layout import KvGroup
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
    assert set(timeline["kv_group"]) == {0, 1}
    # Each point is the pool's fullest moment of its bucket: the groups' blocks then add up
    # to the run's peak in use at one point, and no group passes its own peak.
    assert timeline.groupby("t_s")["in_use"].sum().max() == peaks[2]
    assert (timeline.groupby("kv_group")["in_use"].max() <= [peaks[0], peaks[1]]).all()


def test_a_windows_figures_from_the_rollup_are_its_raw_rows() -> None:
    """`group_rollup` answers for a window exactly what the window's events and pool records
    say, every figure of every group."""
    with RunFile.open(SAMPLE_HYBRID_RUN) as run:
        window = time_grid(run).buckets(300, 700)
        figures = kv_groups.group_figures(run, window).set_index("kv_group")
        span = {"start": window.start_ns, "end": window.end_ns}
        raw = run.frame(
            """
            SELECT coalesce(kv_group, 0) AS kv_group,
                count(*) FILTER (WHERE kind = 'allocate') AS allocated,
                count(*) FILTER (WHERE kind = 'store') AS stored,
                count(*) FILTER (WHERE kind = 'hit') AS block_hits,
                count(*) FILTER (WHERE kind = 'evict') AS evicted,
                avg(block_position) FILTER (WHERE kind = 'hit' AND pos = 0) AS mean_hit_start
            FROM events WHERE ts_ns >= $start AND ts_ns < $end GROUP BY ALL
            """,
            span,
        ).set_index("kv_group")
        peaks = run.rows(
            "SELECT max(num_in_use_by_group[1]), max(num_in_use_by_group[2]) FROM pool "
            "WHERE ts_ns >= $start AND ts_ns < $end",
            span,
        )[0]
    assert not window.is_whole_run and raw["allocated"].min() > 0
    for group in (0, 1):
        for column in ("allocated", "stored", "block_hits", "evicted"):
            assert figures.loc[group, column] == raw.loc[group, column], (group, column)
        assert figures.loc[group, "mean_hit_start"] == pytest.approx(
            raw.loc[group, "mean_hit_start"], abs=1e-9
        )
        assert figures.loc[group, "peak_in_use"] == peaks[group]


def test_the_page_shows_both_groups_and_the_blocks_each_held() -> None:
    app = go_to(start(SAMPLE_HYBRID_RUN), PAGE)
    shown = metrics(app)
    assert len(shown) == 4  # each value short enough to show whole
    assert shown["Holds the most blocks"] == "group 0"
    table = app.dataframe[0].value
    assert list(table["attention"]) == ["full attention", "sliding window of 128 tokens"]
    (chart,) = app.get("plotly_chart")
    names = [trace["name"] for trace in json.loads(chart.proto.spec)["data"]]
    assert names == ["group 0: full attention", "group 1: sliding window of 128 tokens"]
    assert not app.info  # the one-group note is for runs of one group
    with RunFile.open(SAMPLE_HYBRID_RUN) as run:
        cut = run.rows(
            "SELECT count(*), sum(longest_group_hit_tokens - num_hit_tokens) FROM requests "
            "WHERE longest_group_hit_tokens > num_hit_tokens"
        )[0]
    assert cut[0] > 0
    assert shown["Hits cut short by a group"] == f"{cut[0]:,}"
    assert shown["Tokens they lost"].startswith(f"{cut[1]:,} (")


def test_the_run_options_say_the_layout_it_was_replayed_with() -> None:
    with RunFile.open(SAMPLE_HYBRID_RUN) as run:
        assert kv_groups.layout(run) == [
            KvGroup(kind="full", block_size=16, window=0, num_layers=1),
            KvGroup(kind="sliding_window", block_size=16, window=128, num_layers=1),
        ]


@pytest.mark.slow
def test_screenshot_of_the_page(tmp_path: Path) -> None:
    with app_server(REPO, "--db", str(SAMPLE_HYBRID_RUN)) as url, chromium() as driver:
        path = tmp_path / "kv_groups.png"
        seen = screenshot_page(driver, f"{url}/kv_groups", path, 1)
    assert seen["exceptions"] == [] and seen["charts"] >= 1, seen
    assert png_is_not_blank(path)


def test_prefix_rollups_count_the_reference_group_and_heat_keeps_every_group() -> None:
    """A hybrid model caches each prefix once per group: the prefix tree's blocks count the
    full-attention group's hits once; the block heatmap shows either group, or both."""
    with RunFile.open(SAMPLE_HYBRID_RUN) as run:
        reference = run.rows("SELECT kv_group FROM reference_group")
        tree_hits = run.rows("SELECT sum(hits), sum(stores) FROM prefix_blocks")[0]
        group_rows = run.rows(
            "SELECT count(*) FILTER (WHERE kind = 'hit'), count(*) FILTER (WHERE kind = 'store')"
            " FROM events WHERE kv_group = 0"
        )[0]
        window = time_grid(run).whole_run()
        heat = {
            group: int(hotspots.block_heatmap(run, window, kv_group=group)["hits"].sum())
            for group in (None, 0, 1)
        }
        lifetimes = {
            group: int(hotspots.hit_count_frequencies(run, window, kv_group=group)["blocks"].sum())
            for group in (None, 0, 1)
        }
    assert reference == [(0,)]
    assert tree_hits == group_rows
    assert heat[None] == heat[0] + heat[1] and heat[1] > 0
    assert lifetimes[None] == lifetimes[0] + lifetimes[1] and lifetimes[1] > 0


def test_the_hotspots_page_picks_a_group() -> None:
    app = go_to(start(SAMPLE_HYBRID_RUN), "views/hotspots.py")
    picker = app.selectbox(key="hotspots_kv_group")
    assert picker.options == [
        "every group",
        "group 0: full attention",
        "group 1: sliding window of 128 tokens",
    ]
    picker.set_value(1).run()
    assert not app.exception
    heat = json.loads(app.get("plotly_chart")[0].proto.spec)["data"][0]
    assert heat["type"] == "heatmap"


def test_the_advisor_warns_that_its_curves_model_one_group() -> None:
    hybrid = go_to(start(SAMPLE_HYBRID_RUN), "views/advisor.py")
    assert any("2 KV cache groups" in warning.value for warning in hybrid.warning)
    single = go_to(start(), "views/advisor.py")
    assert not any("KV cache groups" in warning.value for warning in single.warning)
