"""Compare runs: two runs side by side (e.g. block size 16 vs 32 on one trace) over the same
seconds of their clocks, deltas highlighted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from collector.charts import comparison as comparison_charts
from collector.charts.theme import DIFFERS_COLOR, VERDICT_COLORS, table_shade
from collector.model import comparison
from collector.queries import activity
from collector.queries.config import run_config
from collector.queries.timeline import time_grid
from collector.store.run_file import StoreError
from visualizer import session
from visualizer.downloads import show_chart
from visualizer.glossary import metric_help
from visualizer.run_source import current_run, open_run, runs_in_folder
from visualizer.sidebar import controls
from visualizer.sidebar.run_picker import FOLDER_KEY
from visualizer.sidebar.time_filter import window_caption

SECOND_RUN_KEY = "compare_run"


def render() -> None:
    first_path = current_run()
    first, window = controls.render()
    st.title("Compare runs")
    folder = Path(session.kept(FOLDER_KEY) or str(first_path.parent)).expanduser()
    others = [str(path) for path in runs_in_folder(folder) if path != first_path]
    if not others:
        st.info(f"Put another run in {folder} (or pick another folder) to compare with it.")
        return
    second_path = Path(
        st.selectbox(
            f"Compare {first_path.name} (the run picked in the sidebar) with",
            others,
            format_func=lambda path: Path(path).name,
            key=SECOND_RUN_KEY,
        )
    )
    try:
        second = open_run(second_path)
    except StoreError as error:
        st.error(f"Cannot compare with this run. {error}")
        return
    second_window = time_grid(second).window(window.start_s, window.end_s)
    st.caption(
        f"Both runs over the same seconds of their clocks: {window_caption(window, first)} "
        f"for the first, {window_caption(second_window, second)} for the second."
    )
    first_config, second_config = run_config(first), run_config(second)
    table = comparison.compare_figures(
        activity.window_figures(first, window),
        activity.window_figures(second, second_window),
        (int(first_config["block_size"]), int(second_config["block_size"])),
    )
    _metrics(table, first_path.name, second_path.name)
    left, right = st.columns(2)
    with left:
        show_chart(comparison_charts.deltas_figure(table), table, key="compare_deltas")
    with right:
        first_points = activity.figures_over_time(first, window)
        second_points = activity.figures_over_time(second, second_window)
        labels = _labels(first_path, second_path)
        points = dict(zip(labels, (first_points, second_points), strict=True))
        figure = comparison_charts.hit_ratio_comparison_figure(points)
        both = pd.concat([frame.assign(run=label) for label, frame in points.items()])
        show_chart(figure, both, key="compare_hit_ratio")
    st.subheader("Figures")
    st.dataframe(_highlighted(table), hide_index=True, height=_fit(len(table)), key="compare_table")
    settings = comparison.compare_settings(first_config, second_config)
    st.subheader("Settings")
    st.dataframe(
        settings.style.apply(_differing, axis=1),
        hide_index=True,
        height=_fit(len(settings)),
        key="compare_settings",
    )


def _labels(first: Path, second: Path) -> tuple[str, str]:
    """The runs' file names, or their paths where the names are the same."""
    if first.name == second.name:
        return str(first), str(second)
    return first.name, second.name


def _fit(rows: int) -> int:
    """A table height that shows every row."""
    return 35 * (rows + 1) + 3


def _metrics(table: pd.DataFrame, first_name: str, second_name: str) -> None:
    st.markdown(f"**{second_name}**, change from **{first_name}**:")
    columns = st.columns(6)
    rows = [
        {str(name): value for name, value in row.items()}
        for row in table.head(6).to_dict("records")
    ]
    for column, row in zip(columns, rows, strict=True):
        column.metric(
            str(row["label"]),
            _number(row["unit"], row["second"]),
            _number(row["unit"], row["delta"], signed=True),
            delta_color=_delta_color(row),
            help=metric_help(str(row["label"])),
        )


def _number(unit: object, value: Any, signed: bool = False) -> str:
    """A ratio as a percentage (a change of one in percentage points), a count as an
    integer with thousands separators."""
    if unit == "ratio":
        return f"{value * 100:+.1f} pts" if signed else f"{value:.1%}"
    return f"{int(value):+,}" if signed else f"{int(value):,}"


def _delta_color(row: dict[str, Any]) -> Any:
    """Streamlit colours an increase green ("normal") or red ("inverse")."""
    if row["verdict"] not in ("better", "worse"):
        return "off"
    increased = row["delta"] > 0
    return "normal" if (row["verdict"] == "better") == increased else "inverse"


def _highlighted(table: pd.DataFrame) -> Any:
    """The figures as text, each row shaded by its verdict."""

    def column(values: str, signed: bool = False) -> list[str]:
        pairs = zip(table["unit"], table[values], strict=True)
        return [_number(unit, value, signed) for unit, value in pairs]

    shown = pd.DataFrame(
        {
            "figure": table["label"],
            "first run": column("first"),
            "second run": column("second"),
            "change": column("delta", signed=True),
            "relative": ["" if pd.isna(v) else f"{v:+.1%}" for v in table["relative_delta"]],
            "verdict": table["verdict"],
        }
    )

    def shade(row: pd.Series) -> list[str]:
        verdict = str(row["verdict"])
        shaded = verdict in ("better", "worse")
        return [table_shade(VERDICT_COLORS[verdict]) if shaded else ""] * len(row)

    return shown.style.apply(shade, axis=1)


def _differing(row: pd.Series) -> list[str]:
    return [table_shade(DIFFERS_COLOR) if row["differs"] else ""] * len(row)


if __name__ == "__main__":
    render()
