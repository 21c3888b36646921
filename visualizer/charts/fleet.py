"""Fleet charts: each engine's hit ratio and load, each engine's pool over time, and the
blocks cached on more than one engine at once."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from visualizer.charts.theme import (
    COLORS,
    RATIO_AXIS,
    alarm_line,
    nth_color,
    styled,
    two_axes_figure,
)

ENGINE_AXIS = {"title": "", "type": "category"}


def engine_hit_ratio_figure(engines: pd.DataFrame) -> go.Figure:
    """Token hit ratio per engine (`fleet.fleet_engines`' rows)."""
    figure = go.Figure(
        go.Bar(
            x=engines["engine"],
            y=engines["hit_ratio"],
            name="token hit ratio",
            marker_color=COLORS["tokens"],
            customdata=engines[["hit_tokens", "prompt_tokens"]],
            hovertemplate="%{x}: %{y:.1%} (%{customdata[0]:,} of %{customdata[1]:,} tokens)"
            "<extra></extra>",
        )
    )
    return styled(
        figure,
        title="Token hit ratio per engine",
        xaxis=ENGINE_AXIS,
        yaxis=RATIO_AXIS,
        hovermode="closest",
    )


def engine_requests_figure(engines: pd.DataFrame) -> go.Figure:
    """Requests per engine, with their prompt tokens on hover."""
    figure = go.Figure(
        go.Bar(
            x=engines["engine"],
            y=engines["requests"],
            name="requests",
            marker_color=COLORS["blocks"],
            customdata=engines["prompt_tokens"],
            hovertemplate="%{x}: %{y:,} requests, %{customdata:,} prompt tokens<extra></extra>",
        )
    )
    return styled(
        figure,
        title="Requests per engine",
        xaxis=ENGINE_AXIS,
        yaxis_title="requests",
        hovermode="closest",
    )


def free_share_figure(timeline: pd.DataFrame, alarm_fraction: float) -> go.Figure:
    """Each engine's free share of its pool over time (`fleet.free_share_timeline`), one line
    per engine, with the alarm line."""
    figure = go.Figure()
    for index, (engine, points) in enumerate(timeline.groupby("engine", sort=False)):
        figure.add_scatter(
            x=points["t_s"],
            y=points["free_share"],
            name=str(engine),
            mode="lines",
            line={"color": nth_color(index)},
        )
    alarm_line(figure, alarm_fraction, alarm_fraction)
    return styled(
        figure,
        title="Free share of each engine's pool",
        xaxis_title="time (s)",
        yaxis={"title": "free blocks", "range": [0, 1], "tickformat": ".0%"},
    )


def duplication_figure(over_time: pd.DataFrame) -> go.Figure:
    """Block hashes cached on more than one engine at once (bars), and the GiB their extra
    copies take (line), per time point (`fleet.fleet_duplication`)."""
    return two_axes_figure(
        go.Bar(
            x=over_time["t_s"],
            y=over_time["duplicated_hashes"],
            name="hashes on more than one engine",
            marker_color=COLORS["cached_free"],
        ),
        go.Scatter(
            x=over_time["t_s"],
            y=over_time["duplicated_gib"],
            name="GiB of extra copies",
            mode="lines",
            line={"color": COLORS["in_use"]},
            customdata=over_time["duplicated_blocks"],
            hovertemplate="%{y:.3g} GiB (%{customdata:,} blocks)",
        ),
        title="Blocks cached on more than one engine",
        left_title="block hashes",
        right_title="GiB",
    )
