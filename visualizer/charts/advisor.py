"""Chart builders for the Advisor page: pure functions from the advisor's chart data."""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go

from collector.charts.theme import COLORS, nth_color, styled


def chart_figure(chart: dict[str, Any]) -> go.Figure:
    """A suggestion's chart (line, bar or scatter) as the advisor described it; a curve of
    "this run" is drawn over the others (wider), and keeps its place in the legend."""
    figure = go.Figure()
    this_run = {
        number
        for number, series in enumerate(chart["series"])
        if series["name"].endswith("(this run)")
    }
    drawn = sorted(enumerate(chart["series"]), key=lambda item: item[0] in this_run)
    for number, series in drawn:
        color = nth_color(number)
        if chart["kind"] == "bar":
            figure.add_bar(x=series["x"], y=series["y"], name=series["name"], marker_color=color)
        else:
            replays = series["name"].startswith("what-if replays")
            mode = "markers" if chart["kind"] == "scatter" or replays else "lines"
            figure.add_scatter(
                x=series["x"],
                y=series["y"],
                name=series["name"],
                mode=mode,
                line={"color": color, "width": 3 if number in this_run else 2},
                marker={"color": color, "size": 9 if replays else 6},
                legendrank=number,
            )
    for number, (label, x) in enumerate(chart["markers"].items()):
        figure.add_vline(
            x=x,
            line={"dash": "dash", "color": COLORS["alarm"]},
            annotation_text=label,
            annotation_position="top right" if number % 2 else "top left",
        )
    yaxis: dict[str, Any] = {"title": chart["y_title"]}
    if chart["y_title"] == "token hit ratio":
        yaxis.update(range=[0, 1], tickformat=".0%")
    return styled(
        figure,
        title=chart["title"],
        xaxis_title=chart["x_title"],
        yaxis=yaxis,
        barmode="group",
    )


def chart_data(chart: dict[str, Any]) -> pd.DataFrame:
    """The numbers behind a suggestion's chart, one row per point of each series."""
    rows = [
        {"series": series["name"], "x": x, "y": y}
        for series in chart["series"]
        for x, y in zip(series["x"], series["y"], strict=True)
    ]
    return pd.DataFrame(rows, columns=["series", "x", "y"])
