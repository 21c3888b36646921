"""The app on the committed sample run: every page renders, with non-empty charts."""

from __future__ import annotations

import json

import pytest
from streamlit.testing.v1 import AppTest

from tests.conftest import REPO, SAMPLE_RUN

PAGES = ["pages/overview.py", "pages/free_blocks.py", "pages/advisor.py"]


def run_page(page: str) -> AppTest:
    app = AppTest.from_file(str(REPO / "visualizer" / "app.py"), default_timeout=60)
    app.session_state["run_path"] = str(SAMPLE_RUN)
    app.run()
    if page != PAGES[0]:
        app.switch_page(page)
        app.run()
    assert not app.exception, app.exception
    return app


def chart_traces(app: AppTest) -> list[list[dict]]:
    charts = app.get("plotly_chart")
    return [json.loads(chart.proto.spec)["data"] for chart in charts]


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_non_empty_charts(page: str) -> None:
    app = run_page(page)
    traces = chart_traces(app)
    assert traces, "the page draws at least one chart"
    for data in traces:
        assert data, "a chart without traces"
        assert any(len(trace.get("x", [])) > 0 for trace in data)


def test_overview_figures_match_the_summary() -> None:
    app = run_page(PAGES[0])
    metrics = {metric.label: metric.value for metric in app.metric}
    assert metrics["Requests"] == "490"
    assert metrics["Hit ratio (tokens)"].endswith("%")
