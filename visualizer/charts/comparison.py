"""Run-versus-run charts: hit ratio over time of both runs, and every figure's change."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from visualizer.charts import COLORS, LAYOUT
from visualizer.charts.palette import VERDICT_COLORS


def hit_ratio_comparison_figure(
    first: pd.DataFrame, second: pd.DataFrame, first_name: str, second_name: str
) -> go.Figure:
    """Token hit ratio over time of two runs (points of `activity.figures_over_time`)."""
    figure = go.Figure()
    for points, name, color, dash in (
        (first, first_name, COLORS["tokens"], "solid"),
        (second, second_name, COLORS["blocks"], "dot"),
    ):
        admitted = points[points["requests"] > 0]
        figure.add_scatter(
            x=admitted["t_s"],
            y=admitted["hit_tokens"] / admitted["prompt_tokens"],
            name=name,
            mode="lines+markers",
            line={"color": color, "dash": dash},
        )
    figure.update_layout(
        title="Hit ratio (tokens), both runs",
        xaxis_title="time (s)",
        yaxis={"title": "hit ratio", "range": [0, 1], "tickformat": ".0%"},
        **LAYOUT,
    )
    return figure


def deltas_figure(comparison: pd.DataFrame) -> go.Figure:
    """Each figure's relative change from the first run to the second, coloured by verdict."""
    rows = comparison[comparison["relative_delta"].notna()]
    figure = go.Figure(
        go.Bar(
            x=rows["relative_delta"],
            y=rows["label"],
            orientation="h",
            marker_color=[VERDICT_COLORS[verdict] for verdict in rows["verdict"]],
            customdata=rows[["first", "second", "verdict"]].astype(str).to_numpy(),
            hovertemplate=(
                "%{y}: %{x:+.1%}<br>%{customdata[0]} -> %{customdata[1]} "
                "(%{customdata[2]})<extra></extra>"
            ),
        )
    )
    figure.add_vline(x=0, line={"color": COLORS["alarm"]})
    figure.update_layout(
        title="Change, second run vs first",
        xaxis={"title": "relative change", "tickformat": "+.0%"},
        yaxis={"autorange": "reversed", "type": "category"},
        height=max(320, 30 * len(rows) + 120),
        **{**LAYOUT, "hovermode": "closest", "margin": {"l": 150, "r": 20, "t": 60, "b": 40}},
    )
    return figure
