"""The Advisor page on the sample run: the same suggestions as `kvscope advise`, their charts,
the what-if curves, and assumptions the user can change."""

from __future__ import annotations

import json
from pathlib import Path

import plotly.graph_objects as go
from streamlit.testing.v1 import AppTest

from collector.advisor import RunContext, advise
from collector.model.kv_memory import MODELS, gib_for_blocks
from collector.store.run_file import RunFile
from tests.support.app import go_to, start
from tests.support.repo import SAMPLE_RUN
from visualizer.charts.advisor import chart_figure


def advisor_page() -> AppTest:
    return go_to(start(SAMPLE_RUN, timeout_s=120), "views/advisor.py")


def test_page_shows_the_advise_suggestions_in_rank_order() -> None:
    with RunFile.open(SAMPLE_RUN) as run_file:
        advice = advise(RunContext(run_file, SAMPLE_RUN))
    app = advisor_page()
    headings = [element.value for element in app.subheader]
    expected = [f"{rank}. {entry.title}" for rank, entry in enumerate(advice.suggestions, 1)]
    assert headings == [*expected, "Checks"]
    assert app.metric[0].value == str(len(advice.suggestions))
    charts = [json.loads(chart.proto.spec) for chart in app.get("plotly_chart")]
    assert len(charts) == 1 + sum(len(entry.charts) for entry in advice.suggestions)
    curves = charts[0]
    assert curves["layout"]["title"]["text"].startswith("What-if")
    names = [trace["name"] for trace in curves["data"]]
    # The run's own curve is drawn last (over the others) and listed first in the legend.
    assert names[-1] == "block size 16 (this run)"
    assert curves["data"][-1]["legendrank"] == 0
    assert "block size 32" in names  # the sample recorded its prompts: other block sizes too
    # The checks table is plain text: a title's `code` marks are dropped there.
    (checks,) = [frame.value for frame in app.dataframe if "rule" in frame.value.columns]
    details = list(checks["detail"])
    assert len(details) == len(advice.checks)
    assert not any("`" in detail for detail in details)
    assert [detail.replace("`", "") for detail in (c.detail for c in advice.checks)] == details
    # One suggestion per flag: the sample's cache-size advice carries the rules that agree.
    flags = [entry.action.split()[0] for entry in advice.suggestions if "--" in entry.action]
    assert len(flags) == len(set(flags))


def test_changing_the_model_changes_the_memory_figures() -> None:
    app = advisor_page()
    size_title = app.subheader[0].value
    assert size_title.startswith("1. Grow the KV cache to ")
    blocks = int(size_title.split(" to ")[1].split(" blocks")[0].replace(",", ""))
    app.selectbox(key="advisor_model").set_value("llama-3.1-70b").run()
    assert not app.exception
    extra = gib_for_blocks(MODELS["llama-3.1-70b"], 16, blocks - 1_200)
    assert app.subheader[0].value == f"1. Grow the KV cache to {blocks:,} blocks (+{extra:.1f} GiB)"


def test_a_folder_without_a_sweep_is_reported(tmp_path: Path) -> None:
    app = advisor_page()
    app.text_input(key="advisor_whatif").set_value(str(tmp_path)).run()
    assert f"{tmp_path}: no whatif.json there" in app.error[0].value
    assert app.subheader[0].value.startswith("1. ")


def test_chart_figures_are_built_from_the_advisors_chart_data() -> None:
    line = {
        "kind": "line",
        "title": "curve",
        "x_title": "blocks",
        "y_title": "token hit ratio",
        "series": [
            {"name": "one-pass curve", "x": [1, 2, 3], "y": [0.1, 0.2, 0.3]},
            {"name": "what-if replays", "x": [2], "y": [0.21]},
        ],
        "markers": {"current": 2, "recommended": 3},
    }
    figure = chart_figure(line)
    assert isinstance(figure, go.Figure)
    assert [trace.mode for trace in figure.data] == ["lines", "markers"]
    assert [shape.x0 for shape in figure.layout.shapes] == [2, 3]
    assert list(figure.layout.yaxis.range) == [0, 1]
    bar = {**line, "kind": "bar", "y_title": "blocks", "markers": {}}
    assert [trace.type for trace in chart_figure(bar).data] == ["bar", "bar"]
    # The run's own curve is drawn over the other block sizes', and listed first still.
    curves = {
        **line,
        "series": [
            {"name": "block size 16 (this run)", "x": [1, 2], "y": [0.1, 0.2]},
            {"name": "block size 32", "x": [1, 2], "y": [0.1, 0.3]},
        ],
    }
    drawn = chart_figure(curves).data
    assert [trace.name for trace in drawn] == ["block size 32", "block size 16 (this run)"]
    assert [trace.legendrank for trace in drawn] == [1, 0]
    assert drawn[1].line.width > drawn[0].line.width
