"""The report's charts (the app's run-versus-run charts) as pure functions, and the HTML page
around them, without a browser."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from collector.charts import comparison as charts
from collector.queries.tenants import TenantHitRatio
from collector.report.figures import read_run
from collector.report.html import comparison_figures, render_html
from collector.report.thresholds import Thresholds
from collector.report.verdict import compare
from tests.support.block_manager import tiny_run
from tests.support.modules import loaded_modules
from tests.support.repo import SAMPLE_RUN

BUCKETS = pd.DataFrame(
    {
        "t_s": [0.0, 1.0, 2.0],
        "requests": [2, 0, 1],
        "prompt_tokens": [100, 0, 40],
        "hit_tokens": [25, 0, 40],
    }
)


def test_hit_ratio_lines_skip_buckets_without_requests() -> None:
    figure = charts.hit_ratio_comparison_figure({"baseline": BUCKETS, "candidate": BUCKETS[:1]})
    assert [trace.name for trace in figure.data] == ["baseline", "candidate"]
    assert list(figure.data[0].x) == [0.0, 2.0]
    assert list(figure.data[0].y) == [0.25, 1.0]
    assert figure.data[0].line.color != figure.data[1].line.color


def test_free_blocks_are_a_share_of_each_pool() -> None:
    pool = pd.DataFrame({"t_s": [0.0, 1.0], "free": [100, 25]})
    figure = charts.free_blocks_comparison_figure({"baseline": (pool, 100), "small": (pool, 50)})
    assert [trace.name for trace in figure.data] == ["baseline (100 blocks)", "small (50 blocks)"]
    assert list(figure.data[0].y) == [1.0, 0.25]
    assert list(figure.data[1].y) == [2.0, 0.5]
    assert figure.layout.shapes[0].y0 == 0.10


def test_evictions_accumulate() -> None:
    evictions = pd.DataFrame({"t_s": [0.0, 0.5, 3.0], "count": [4, 1, 10]})
    figure = charts.evictions_comparison_figure({"baseline": evictions})
    assert list(figure.data[0].y) == [4, 5, 15]


def test_tenant_bars_name_adapters() -> None:
    rows = [
        TenantHitRatio("acme", "(none)", requests=5, prompt_tokens=10, hit_tokens=5, hit_ratio=0.5),
        TenantHitRatio("acme", "sql", requests=2, prompt_tokens=8, hit_tokens=2, hit_ratio=0.25),
    ]
    figure = charts.tenant_hit_ratio_figure({"baseline": rows, "candidate": rows[:1]})
    assert list(figure.data[0].x) == ["acme", "acme/sql"]
    assert list(figure.data[0].y) == [0.5, 0.25]
    assert list(figure.data[1].x) == ["acme"]
    assert figure.layout.barmode == "group"


@pytest.fixture(scope="module")
def sample_html() -> str:
    baseline, baseline_series = read_run(SAMPLE_RUN, None)
    comparison = compare(baseline, baseline, Thresholds(), "defaults")
    return render_html(comparison, baseline_series, baseline_series)


def test_html_is_self_contained(sample_html: str) -> None:
    """plotly.js inlined once; no script, style or image fetched from anywhere."""
    assert sample_html.count("<script>/**\n* plotly.js v") == 1
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", sample_html)
    assert sample_html.count('class="chart"') == 4
    assert "<title>kvscope report: pass</title>" in sample_html


def test_every_chart_of_the_sample_run_has_data() -> None:
    baseline, series = read_run(SAMPLE_RUN, None)
    comparison = compare(baseline, baseline, Thresholds(), "defaults")
    for figure in comparison_figures(comparison, series, series):
        assert len(figure.data) == 2, figure.layout.title.text
        for trace in figure.data:
            assert len(trace.x) > 0, (figure.layout.title.text, trace.name)


def test_a_run_without_evictions_draws_empty_lines(tmp_path: Path) -> None:
    rows = [{"timestamp": 0, "token_ids": list(range(1, 9)), "output_length": 0}]
    run, series = read_run(tiny_run(tmp_path, rows, num_blocks=10), None)
    comparison = compare(run, run, Thresholds(), "defaults")
    evictions = comparison_figures(comparison, series, series)[2]
    assert [len(trace.x) for trace in evictions.data] == [0, 0]


def test_the_report_loads_no_streamlit() -> None:
    """It draws with the app's charts, which are plain Plotly."""
    modules = loaded_modules("import collector.commands.report, collector.report.outputs")
    assert "streamlit" not in modules
