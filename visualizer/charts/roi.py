"""ROI charts: compute saved against memory held, over time, per tenant and per prefix."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from visualizer.charts.theme import COLORS, LAYOUT, per_point, styled, two_axes_figure


def savings_over_time_figure(series: pd.DataFrame) -> go.Figure:
    """GPU-seconds saved per point (bars) and GB held by cached blocks (line, right axis)."""
    return two_axes_figure(
        go.Bar(
            x=series["t_s"],
            y=series["gpu_seconds_saved"],
            name="GPU-seconds saved",
            marker_color=COLORS["tokens"],
            customdata=series["dollars_saved"],
            hovertemplate="%{y:.3g} GPU-s saved ($%{customdata:.3g})<extra></extra>",
        ),
        go.Scatter(
            x=series["t_s"],
            y=series["gb_held"],
            name="GB held by cached blocks",
            mode="lines",
            line={"color": COLORS["cached_free"]},
            hovertemplate="%{y:.3g} GB held<extra></extra>",
        ),
        title="Compute saved vs memory held",
        left_title=per_point(series, "GPU-seconds saved"),
        right_title="GB held",
    )


def saved_vs_held_figure(priced: pd.DataFrame, label_column: str, title: str) -> go.Figure:
    """Dollars saved by hits and dollars of memory held, side by side per row (rows top
    down in the frame's order)."""
    labels = priced[label_column].astype(str)
    figure = go.Figure()
    figure.add_bar(
        y=labels,
        x=priced["dollars_saved"],
        orientation="h",
        name="$ of compute saved",
        marker_color=COLORS["tokens"],
        customdata=priced["gpu_seconds_saved"],
        hovertemplate="%{y}: $%{x:.3g} saved (%{customdata:.3g} GPU-s)<extra></extra>",
    )
    figure.add_bar(
        y=labels,
        x=priced["memory_dollars"],
        orientation="h",
        name="$ of memory held",
        marker_color=COLORS["cached_free"],
        customdata=priced["gb_hours_held"],
        hovertemplate="%{y}: $%{x:.3g} of memory (%{customdata:.3g} GB-h)<extra></extra>",
    )
    return styled(
        figure,
        title=title,
        xaxis_title="dollars",
        yaxis={"type": "category", "autorange": "reversed", "automargin": True},
        barmode="group",
        height=max(360, 44 * len(priced) + 160),
        hovermode="closest",
        # Under the axis title whatever the chart's height: pinned to the container.
        legend={"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom"},
        margin=LAYOUT["margin"] | {"b": 80},
    )
