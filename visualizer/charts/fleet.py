"""Fleet charts: each engine's hit ratio and load, each engine's pool over time, and the
blocks cached on more than one engine at once."""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go

from collector.charts.theme import (
    COLORS,
    RATIO_AXIS,
    free_share_lines,
    nth_color,
    styled,
    time_bars,
    time_line,
    two_axes_figure,
)

ENGINE_AXIS = {"title": "", "type": "category"}


def engine_hit_ratio_figure(engines: pd.DataFrame) -> go.Figure:
    """Token hit ratio per engine (`fleet.fleet_engines`' rows)."""
    return _engine_bars(
        engines,
        "hit_ratio",
        "token hit ratio",
        COLORS["tokens"],
        engines[["hit_tokens", "prompt_tokens"]],
        "%{x}: %{y:.1%} (%{customdata[0]:,} of %{customdata[1]:,} tokens)<extra></extra>",
        title="Token hit ratio per engine",
        yaxis=RATIO_AXIS,
    )


def engine_requests_figure(engines: pd.DataFrame) -> go.Figure:
    """Requests per engine, with their prompt tokens on hover."""
    return _engine_bars(
        engines,
        "requests",
        "requests",
        COLORS["blocks"],
        engines["prompt_tokens"],
        "%{x}: %{y:,} requests, %{customdata:,} prompt tokens<extra></extra>",
        title="Requests per engine",
        yaxis_title="requests",
    )


def _engine_bars(  # noqa: PLR0917 - the bar's own settings, as go.Bar names them
    engines: pd.DataFrame,
    column: str,
    name: str,
    color: str,
    customdata: pd.DataFrame | pd.Series,
    hovertemplate: str,
    **layout: Any,
) -> go.Figure:
    """One bar per engine of `column`, its hover from `customdata`."""
    figure = go.Figure(
        go.Bar(
            x=engines["engine"],
            y=engines[column],
            name=name,
            marker_color=color,
            customdata=customdata,
            hovertemplate=hovertemplate,
        )
    )
    return styled(figure, xaxis=ENGINE_AXIS, hovermode="closest", **layout)


def free_share_figure(timeline: pd.DataFrame, alarm_fraction: float) -> go.Figure:
    """Each engine's free share of its pool over time (`fleet.free_share_timeline`), one line
    per engine, with the alarm line."""
    lines = [
        (str(engine), points["t_s"], points["free_share"], {"color": nth_color(index)})
        for index, (engine, points) in enumerate(timeline.groupby("engine", sort=False))
    ]
    return free_share_lines(lines, alarm_fraction, "Free share of each engine's pool", 1)


def duplication_figure(over_time: pd.DataFrame) -> go.Figure:
    """Block hashes cached on more than one engine at once (bars), and the GiB their extra
    copies take (line), per time point (`fleet.fleet_duplication`)."""
    return two_axes_figure(
        time_bars(
            over_time, "duplicated_hashes", "hashes on more than one engine", COLORS["cached_free"]
        ),
        time_line(
            over_time,
            "duplicated_gib",
            "GiB of extra copies",
            COLORS["in_use"],
            customdata=over_time["duplicated_blocks"],
            hovertemplate="%{y:.3g} GiB (%{customdata:,} blocks)",
        ),
        title="Blocks cached on more than one engine",
        left_title="block hashes",
        right_title="GiB",
    )
