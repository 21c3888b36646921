"""ROI charts: compute saved over time (against memory held), per tenant and per prefix."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from collector.charts.theme import COLORS, per_point, styled, time_bars, time_line, two_axes_figure


def savings_over_time_figure(series: pd.DataFrame) -> go.Figure:
    """GPU-seconds saved per point (bars) and GB held by cached blocks (line, right axis)."""
    return two_axes_figure(
        time_bars(
            series,
            "gpu_seconds_saved",
            "GPU-seconds saved",
            COLORS["tokens"],
            customdata=series["dollars_saved"],
            hovertemplate="%{y:.3g} GPU-s saved ($%{customdata:.3g})<extra></extra>",
        ),
        time_line(
            series,
            "gb_held",
            "GB held by cached blocks",
            COLORS["cached_free"],
            hovertemplate="%{y:.3g} GB held<extra></extra>",
        ),
        title="Compute saved vs memory held",
        left_title=per_point(series, "GPU-seconds saved"),
        right_title="GB held",
    )


def saved_per_day_figure(priced: pd.DataFrame, label_column: str, title: str) -> go.Figure:
    """Dollars saved per day at the window's rate, a bar per row (rows top down in the
    frame's order); the hover adds GPU-hours per day and the GB-hours the row's cached
    blocks held."""
    labels = priced[label_column].astype(str)
    figure = go.Figure(
        go.Bar(
            y=labels,
            x=priced["dollars_per_day"],
            orientation="h",
            name="USD saved per day",
            marker_color=COLORS["tokens"],
            customdata=priced[["gpu_hours_per_day", "gb_hours_held"]].to_numpy(),
            hovertemplate="%{y}: $%{x:,.2f} a day (%{customdata[0]:.3g} GPU-h a day); "
            "its cached blocks held %{customdata[1]:.3g} GB-h<extra></extra>",
        )
    )
    return styled(
        figure,
        title=title,
        xaxis_title="USD saved per day at this window's rate",
        yaxis={"type": "category", "autorange": "reversed", "automargin": True},
        height=max(360, 32 * len(priced) + 160),
        hovermode="closest",
        showlegend=False,
    )
