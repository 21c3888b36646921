"""Chart builders on the query results of a small real run (tests/support/runs.py): the data each
figure draws, exactly."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from collector.charts import comparison as comparison_charts
from collector.charts.theme import (
    CATEGORY_COLORS,
    LAYOUT,
    ROOT_COLOR,
    VERDICT_COLORS,
    WALL_HOVER,
    WALL_TITLE,
    category_colors,
    on_wall_clock,
)
from collector.model import comparison, cost
from collector.queries import activity, collisions, hotspots, prefix_tree, tenants
from collector.queries.timeline import time_grid
from collector.store.run_file import RunFile
from tests.support.modules import loaded_modules
from tests.support.runs import hex_names, shared_prefix_run
from visualizer.charts import collisions as collision_charts
from visualizer.charts import free_blocks as free_block_charts
from visualizer.charts import hotspots as hotspot_charts
from visualizer.charts import overview as overview_charts
from visualizer.charts import prefix_tree as tree_charts
from visualizer.charts import roi as roi_charts
from visualizer.charts import tenants as tenant_charts


@pytest.fixture(scope="module")
def run_file(tmp_path_factory: pytest.TempPathFactory) -> RunFile:
    run = shared_prefix_run(Path(tmp_path_factory.mktemp("charts")))
    return RunFile.open(run)


@pytest.fixture(scope="module")
def points(run_file: RunFile) -> pd.DataFrame:
    return activity.figures_over_time(run_file, time_grid(run_file).whole_run())


def test_heatmap(run_file: RunFile) -> None:
    heat = hotspots.block_heatmap(run_file, time_grid(run_file).whole_run())
    figure = hotspot_charts.heatmap_figure(heat, "hits", block_bin_size=1)
    (trace,) = figure.data
    assert list(trace.x) == [0.0, 0.01, 0.02, 0.03]
    assert list(trace.y) == [1, 2, 3, 4, 5]
    blank = None  # nothing happened in that cell: left blank, not tinted
    assert np.where(np.isnan(trace.z), blank, trace.z).tolist() == [
        [blank, 1, 1, blank],  # block 1 held A1: hit by b0 and a1
        [blank, 1, blank, blank],  # block 2 held A2: hit by b0
        [blank, blank, blank, blank],
        [blank, blank, blank, blank],
        [blank, blank, blank, blank],
    ]
    evictions = hotspot_charts.heatmap_figure(heat, "evictions", block_bin_size=1)
    assert np.nan_to_num(evictions.data[0].z).tolist()[2] == [0, 0, 0, 1]
    assert "one row per block" in figure.layout.title.text
    assert trace.hovertemplate.startswith("t = %{x}%{meta}<br>")
    assert (trace.meta, figure.layout.xaxis.hoverformat) == (" s", ",.1f")  # "t = 0.0 s"


def test_top_blocks_and_reuse(run_file: RunFile) -> None:
    names = hex_names(run_file)
    window = time_grid(run_file).whole_run()
    runs = hotspots.block_runs(hotspots.top_blocks(run_file, window), "hits", 20)
    top = hotspot_charts.top_blocks_figure(runs.assign(label=["first", "second"]))
    assert list(top.data[0].x) == [2, 1]  # A1 and A2 differ in hits: a bar each
    assert list(top.data[0].y) == ["first", "second"]
    assert runs["first_hash"].tolist() == [names["A1"], names["A2"]]
    frequencies = hotspots.hit_count_frequencies(run_file, window)
    histogram = hotspot_charts.hit_histogram_figure(hotspots.hit_count_histogram(frequencies))
    assert (list(histogram.data[0].x), list(histogram.data[0].y)) == (["0", "1", "2"], [4, 1, 1])
    curve = hotspot_charts.concentration_figure(frequencies).data[0]
    # Most-hit first: A1 (2 of 3 hits), A2 (the last one), then four blocks never hit.
    assert list(curve.x) == pytest.approx([0, 1 / 6, 2 / 6, 1])
    assert list(curve.y) == pytest.approx([0, 2 / 3, 1, 1])


def test_prefix_tree(run_file: RunFile) -> None:
    names = hex_names(run_file)
    nodes = prefix_tree.merge_unbranched(
        prefix_tree.tree_nodes(run_file, time_grid(run_file).whole_run())
    )
    figure = tree_charts.prefix_tree_figure(nodes, "tenant", block_size=4)
    icicle = figure.data[0]
    assert list(icicle.ids) == ["all", names["A1"], names["A2"]]
    assert list(icicle.parents) == ["", "all", names["A1"]]
    assert list(icicle.values) == [2, 2, 1]
    assert list(icicle.labels) == ["all prefixes<br>2 hits", "pos 0<br>2 hits", "pos 1<br>1 hits"]
    tenant_a = category_colors(["a"])["a"]
    assert list(icicle.marker.colors) == [ROOT_COLOR, tenant_a, tenant_a]
    assert icicle.maxdepth == 3  # the root and two levels: no empty columns
    assert [trace.name for trace in figure.data[1:]] == ["a"]  # the colour key
    assert [row[3] for row in icicle.customdata] == [0, 4, 8]  # prefix tokens
    by_age = tree_charts.prefix_tree_figure(nodes, "age", block_size=4).data[0]
    assert list(by_age.marker.colors) == [None, 0.0, 0.0]
    assert len(tree_charts.prefix_tree_figure(nodes, "adapter", 4).data) == 2  # "(none)"


def test_roi_charts(run_file: RunFile, points: pd.DataFrame) -> None:
    model = cost.CostModel()
    series = cost.savings_over_time(points, model, block_size=4)
    figure = roi_charts.savings_over_time_figure(series)
    saved, held = figure.data
    flops = model.prompt_flops(8.0, 64.0), model.prompt_flops(4.0, 16.0)
    expected = [0.0, flops[0] / (989e12 * 0.4), flops[1] / (989e12 * 0.4), 0.0]
    assert list(saved.y) == pytest.approx(expected)
    per_block = 2 * 32 * 8 * 128 * 2 * 4 / 1e9  # GB per cached block of 4 tokens
    assert list(held.y) == pytest.approx(
        [2 * per_block, 3 * per_block, 4 * per_block, 5 * per_block]
    )
    window = time_grid(run_file).whole_run()
    usage = cost.price_prompts(tenants.tenant_usage(run_file, window), model, 4)
    usage = cost.per_day(usage, window.duration_s)
    bars = roi_charts.saved_per_day_figure(usage, "tenant", "Per tenant")
    (saved_per_day,) = bars.data
    assert list(saved_per_day.y) == ["a", "b", "c"]
    day = 86_400 / window.duration_s
    assert list(saved_per_day.x) == pytest.approx(list(usage["dollars_saved"] * day))
    assert saved_per_day.customdata[:, 1].tolist() == pytest.approx(list(usage["gb_hours_held"]))


def test_tenant_charts(run_file: RunFile) -> None:
    window = time_grid(run_file).whole_run()
    usage = tenants.tenant_usage(run_file, window)
    tokens = tenant_charts.tenant_tokens_figure(usage)
    assert list(tokens.data[0].y) == [4, 8, 0]  # hit tokens of a, b, c
    assert list(tokens.data[1].y) == [12, 4, 8]  # computed
    held = tenant_charts.blocks_held_figure(usage)
    assert list(held.data[1].y) == [3, 1, 2]  # blocks stored
    sharing = tenant_charts.sharing_figure(tenants.cross_tenant_hits(run_file, window))
    (heat,) = sharing.data
    assert (list(heat.y), list(heat.x), heat.z.tolist()) == (["a"], ["a", "b"], [[1, 2]])
    adapters = pd.DataFrame({"tenant": ["t", "t"], "lora": ["(none)", "sql"]})
    assert tenant_charts.usage_label(adapters).tolist() == ["t", "t<br>sql"]


def test_collision_chart(run_file: RunFile, points: pd.DataFrame) -> None:
    check = collisions.collision_check(run_file, time_grid(run_file).whole_run())
    figure = collision_charts.collision_checks_figure(points, check["hash_algo"])
    assert figure.layout.title.text == "0 collisions in 3 block hits checked (sha256)"
    assert list(figure.data[0].y) == [0, 2, 1, 0]
    assert list(figure.data[1].x) == []  # no collision marker


def test_overview_charts(points: pd.DataFrame) -> None:
    ratio = overview_charts.hit_rate_figure(points)
    assert list(ratio.data[0].y) == pytest.approx([0.0, 8 / 12, 4 / 8, 0.0])
    activity_chart = overview_charts.activity_figure(points)
    assert list(activity_chart.data[0].y) == [0, 0, 0, 1]  # evictions
    assert list(activity_chart.data[1].y) == [1, 1, 1, 1]  # requests, right axis
    assert activity_chart.data[1].yaxis == "y2"
    tokens = overview_charts.tokens_saved_figure(points)
    assert (list(tokens.data[0].y), list(tokens.data[1].y)) == ([0, 8, 4, 0], [8, 4, 4, 8])
    # With an offload tier, the tokens it supplied stack between the hits and the prefill.
    tiered = overview_charts.tokens_saved_figure(points.assign(tier_hit_tokens=[4, 0, 0, 0]))
    assert [trace.name for trace in tiered.data] == [
        "served from the prefix cache",
        "loaded from the CPU tier",
        "computed (prefill)",
    ]
    assert [list(trace.y) for trace in tiered.data] == [[0, 8, 4, 0], [4, 0, 0, 0], [4, 4, 4, 8]]
    blocks = overview_charts.block_events_figure(points)
    # Hits, evictions, then stores (dashed, on top: level with evictions in a full pool).
    assert [trace.name for trace in blocks.data] == [
        "block hits",
        "blocks evicted",
        "blocks stored",
    ]
    assert [list(trace.y) for trace in blocks.data] == [[0, 2, 1, 0], [0, 0, 0, 1], [2, 1, 1, 2]]
    assert blocks.data[2].line.dash == "dash"
    # Every "per point" axis names the point's width.
    width = float(points["width_s"].iloc[0])
    assert blocks.layout.yaxis.title.text == f"blocks per {width:.3g} s"
    assert activity_chart.layout.yaxis2.title.text == f"requests per {width:.3g} s"
    integrity = overview_charts.integrity_figure(points)
    assert integrity.layout.title.text == "Integrity: 0 collisions, 0 dropped events"


def test_comparison_charts(points: pd.DataFrame) -> None:
    fewer = points.assign(hit_tokens=points["hit_tokens"] // 2)
    figure = comparison_charts.hit_ratio_comparison_figure({"a": points, "b": fewer})
    assert [trace.name for trace in figure.data] == ["a", "b"]
    assert list(figure.data[1].y) == pytest.approx([0.0, 4 / 12, 2 / 8, 0.0])
    first = {figure.name: 1_000 for figure in comparison.COMPARED_FIGURES}
    second = first | {"evictions": 500, "hit_tokens": 500, "preemptions": 1_004}
    table = comparison.compare_figures(first, second)
    deltas = comparison_charts.deltas_figure(table)
    bars = deltas.data[0]
    # 4 more preemptions are within the floor: left out of the bars, named in the title.
    assert list(bars.y) == [
        figure.label for figure in comparison.COMPARED_FIGURES if figure.name != "preemptions"
    ]
    assert "too small to call, left out: Preemptions (1,000 -> 1,004)" in deltas.layout.title.text
    colours = dict(zip(bars.y, bars.marker.color, strict=True))
    assert colours["Evictions (blocks)"] == VERDICT_COLORS["better"]
    assert colours["Tokens saved"] == VERDICT_COLORS["worse"]
    assert colours["Requests"] == VERDICT_COLORS["same"]


def _free_blocks_of_ten(
    timeline: pd.DataFrame, evictions: pd.DataFrame, start_s: float, end_s: float
) -> go.Figure:
    """The free-blocks chart of a pool of 10 usable blocks, no preemptions, one stretch under
    the alarm from `start_s` to `end_s`."""
    return free_block_charts.free_blocks_figure(
        timeline,
        evictions=evictions,
        preemptions=evictions.iloc[:0],
        low_periods=pd.DataFrame({"start_s": [start_s], "end_s": [end_s]}),
        num_usable_blocks=10,
    )


def test_free_blocks_chart_marks_evictions_and_the_time_under_the_alarm() -> None:
    timeline = pd.DataFrame(
        {"t_s": [0.0, 1.0], "in_use": [3, 8], "cached_free": [2, 1], "free_uncached": [5, 1]}
    )
    evictions = pd.DataFrame({"t_s": [0.0, 1.0], "count": [1, 4]})
    figure = _free_blocks_of_ten(timeline, evictions, start_s=0.5, end_s=1.0)
    names = [trace.name for trace in figure.data]
    assert names == [
        "in use",
        "cached but free (evictable)",
        "free, no cached content",
        "evictions",
    ]
    assert list(figure.data[0].y) == [3, 8]
    marker = figure.data[3]
    assert (list(marker.y), marker.hovertemplate) == (
        [10.3, 10.3],
        "%{customdata} evicted<extra></extra>",
    )
    assert list(marker.marker.size) == [9.0, 14.0]  # 4 + 10 x the square root of 1/4, 4/4
    alarm, under = figure.layout.shapes
    assert alarm.y0 == 9  # 10 % of 10 usable blocks free
    assert (under.x0, under.x1) == (0.5, 1.0)


def test_a_time_chart_on_the_wall_clock_moves_everything_on_its_time_axis() -> None:
    """Series, the shaded stretch and an engine marker move to the same instants; the alarm
    line (across the whole axis) stays; a heatmap's columns move too; no origin: unchanged."""
    timeline = pd.DataFrame(
        {"t_s": [0.0, 90_000.0], "in_use": [3, 8], "cached_free": [2, 1], "free_uncached": [5, 1]}
    )
    marks = pd.DataFrame({"t_s": [90_000.0], "count": [2]})
    figure = _free_blocks_of_ten(timeline, marks, start_s=3_600.0, end_s=7_200.5)
    figure = overview_charts.with_markers(figure, marks.assign(label="host:2 started"))
    assert on_wall_clock(figure, None) is figure and figure.layout.xaxis.type is None
    origin = datetime(2026, 12, 4, 18, 0)
    on_wall_clock(figure, origin)
    assert list(figure.data[0].x) == [origin, datetime(2026, 12, 5, 19, 0)]
    assert list(figure.data[3].x) == [datetime(2026, 12, 5, 19, 0)]  # the evictions' marks
    alarm, under, marker = figure.layout.shapes
    assert (alarm.xref, alarm.x0, alarm.x1) == ("x domain", 0, 1)
    assert (under.x0, under.x1) == (
        datetime(2026, 12, 4, 19),
        datetime(2026, 12, 4, 20, 0, 0, 500_000),
    )
    assert marker.x0 == marker.x1 == figure.layout.annotations[-1].x == datetime(2026, 12, 5, 19)
    assert figure.layout.annotations[0].xref == "x domain"  # the alarm line's label
    xaxis = figure.layout.xaxis
    assert (xaxis.type, xaxis.title.text, xaxis.hoverformat) == ("date", WALL_TITLE, WALL_HOVER)
    assert figure.layout.legend.y < LAYOUT["legend"]["y"]  # under the dates' ticks
    heat = pd.DataFrame({"block_start": [0, 0], "t_s": [0.0, 60.0], "hits": [1, 2]})
    heatmap = on_wall_clock(hotspot_charts.heatmap_figure(heat, "hits", 1), origin)
    assert list(heatmap.data[0].x) == [origin, datetime(2026, 12, 4, 18, 1)]
    assert heatmap.data[0].meta == ""  # the hover's wall time, without " s" after it


def test_charts_load_no_streamlit() -> None:
    """The CI report draws them too, without the app."""
    modules = loaded_modules(
        "import importlib, pkgutil, visualizer.charts as charts; "
        "[importlib.import_module(f'visualizer.charts.{module.name}') "
        "for module in pkgutil.iter_modules(charts.__path__)]"
    )
    assert "plotly" in modules
    assert "streamlit" not in modules


def test_a_label_keeps_its_colour_whatever_else_is_drawn() -> None:
    # crc32 picks the 5th palette colour for "acme", the 9th for "globex" and "initech".
    alone = {label: category_colors([label])[label] for label in ("acme", "globex", "initech")}
    together = category_colors(["initech", "acme", "globex"])
    assert alone["acme"] == together["acme"] == CATEGORY_COLORS[4]
    assert alone["globex"] == together["globex"] == CATEGORY_COLORS[8]
    # "initech" picks globex's colour too; after it in sorted order, it takes the next free.
    assert alone["initech"] == CATEGORY_COLORS[8] and together["initech"] == CATEGORY_COLORS[9]
    assert together["(none)"] == together[""] != together["acme"]
    # More labels than colours: every one still gets a colour.
    many = category_colors([f"tenant {index}" for index in range(25)])
    assert set(many.values()) <= {*CATEGORY_COLORS, together["(none)"]}
