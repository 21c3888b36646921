"""kvscope's one look: the layout every chart shares and every colour charts and tables use.

One hex value per hue, mostly D3's category10 (Plotly's default colours) and its light tints;
the names below say what each colour means.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

BLUE = "#1f77b4"
LIGHT_BLUE = "#aec7e8"
ORANGE = "#ff7f0e"
GREEN = "#2ca02c"
RED = "#d62728"
PURPLE = "#9467bd"
BROWN = "#8c564b"
LIGHT_BROWN = "#c49c94"
PINK = "#e377c2"
GREY = "#7f7f7f"
LIGHT_GREY = "#c7c7c7"
PALE_GREY = "#eeeeee"
OLIVE = "#bcbd22"
CYAN = "#17becf"
BLACK = "#000000"

# What the block pool's and the requests' series are drawn in, on every page.
COLORS = {
    "in_use": RED,
    "cached_free": BLUE,
    "free_uncached": LIGHT_BLUE,
    "tokens": GREEN,
    "blocks": PURPLE,
    "evictions": ORANGE,
    "preemptions": BLACK,
    "alarm": GREY,
}
# Runs, tenants, adapters, advisor series: one colour each, in this order. Red and grey come
# last: they mean a problem and "nothing" elsewhere.
CATEGORY_COLORS = (BLUE, ORANGE, GREEN, PURPLE, BROWN, PINK, CYAN, OLIVE, RED, GREY)
# Line styles that keep runs apart where colour alone may not (print, colour blindness).
RUN_DASHES = ("solid", "dot", "dash", "dashdot")
NO_LABEL_COLOR = LIGHT_GREY
ROOT_COLOR = PALE_GREY
VERDICT_COLORS = {"better": GREEN, "worse": RED, "same": GREY, "": BLUE}
DIFFERS_COLOR = ORANGE

# Plotly's plotly_white look: its layout, and the two of its trace defaults kvscope's charts
# show (bars' white outline, heatmaps' plain colour bar), as Plotly's default template: every
# figure starts from it. A figure given a template copies it again, and plotly_white whole,
# given to each, was a quarter of the Overview's first drawing (0.33 s of its 1.24 s script,
# 7 charts, profiled under load); a bar chart made and serialized: 2.9 ms this way, 7.5 ms
# given this template, 15-18 ms given plotly_white (side by side, one process).
TEMPLATE = go.layout.Template(
    layout=pio.templates["plotly_white"].layout,
    data={
        "bar": [go.Bar(marker_line={"color": "white", "width": 0.5})],
        "heatmap": [go.Heatmap(colorbar={"outlinewidth": 0, "ticks": ""})],
    },
)
pio.templates["kvscope"] = TEMPLATE
pio.templates.default = "kvscope"
LAYOUT: dict[str, Any] = {
    "margin": {"l": 60, "r": 20, "t": 60, "b": 40},
    "legend": {"orientation": "h", "yanchor": "top", "y": -0.15, "x": 0},
    "hovermode": "x unified",
}
RATIO_AXIS = {"title": "hit ratio", "range": [0, 1], "tickformat": ".0%"}
# A time chart's x axis on the wall clock: the hover's time, and the axis title.
WALL_HOVER = "%a %d %b %H:%M:%S UTC"
WALL_TITLE = "time (UTC)"
# A time chart's hover unit: a trace whose hovertemplate writes `%{x}%{meta}` and whose meta
# is this reads "12.5 s" on a run's clock, and the wall time alone once on_wall_clock moved it.
SECONDS_UNIT = " s"


def blank_zeros(grid: pd.DataFrame) -> np.ndarray:
    """A heatmap's counts with the cells where nothing happened as NaN: left blank, not
    tinted at the bottom of the scale."""
    counts = grid.to_numpy(dtype=float, copy=True)
    counts[counts == 0] = np.nan
    return counts


def per_point(points: pd.DataFrame, what: str) -> str:
    """An axis title for a figure summed over each point of `activity.figures_over_time`,
    naming the point's width: "blocks per 3.93 s"."""
    if "width_s" not in points or points.empty:
        return f"{what} per point"
    return f"{what} per {duration_words(float(points['width_s'].iloc[0]))}"


def duration_words(seconds: float) -> str:
    """A time point's width as read: "3.93 s", "75 min", "1.5 h" (not "4.5e+03 s")."""
    if seconds >= 5400:
        return f"{seconds / 3600:.3g} h"
    if seconds >= 90:
        return f"{seconds / 60:.3g} min"
    return f"{seconds:.3g} s"


def styled(figure: go.Figure, **layout: Any) -> go.Figure:
    """The figure with the shared layout, `layout`'s keys replacing it where given."""
    figure.update_layout(**{**LAYOUT, **layout})
    return figure


def on_wall_clock(figure: go.Figure, origin: datetime | None) -> go.Figure:
    """The time chart `figure`, its x in seconds from a run's first record, on the wall clock
    (UTC) from `origin`, the first record's time: its series, and the vertical lines, bands
    and labels placed on its x axis, move to the same instants; the axis becomes a date axis
    (dates at day boundaries) and hovers give the wall time. `origin` None: as it is."""
    if origin is None:
        return figure

    def wall(seconds: Any) -> Any:
        return pd.Timestamp(origin) + pd.to_timedelta(seconds, unit="s")

    for trace in figure.data:
        if trace.x is not None and trace.xaxis in (None, "x"):
            trace.x = wall(np.asarray(trace.x, dtype=float)).to_pydatetime()
            if trace.meta == SECONDS_UNIT:
                trace.meta = ""
    for shape in figure.layout.shapes:
        if shape.xref == "x":
            shape.x0, shape.x1 = wall(shape.x0).to_pydatetime(), wall(shape.x1).to_pydatetime()
    for annotation in figure.layout.annotations:
        if annotation.xref == "x":
            annotation.x = wall(annotation.x).to_pydatetime()
    if figure.layout.legend.y is not None and figure.layout.legend.y < 0:
        # under the dates' two lines of ticks and the axis title, not over them
        figure.update_layout(legend_y=figure.layout.legend.y - 0.12)
    return figure.update_xaxes(type="date", title_text=WALL_TITLE, hoverformat=WALL_HOVER)


def alarm_line(figure: go.Figure, y: float, alarm_fraction: float) -> None:
    """The pool's alarm line at `y`, labelled with the free share it stands for."""
    figure.add_hline(
        y=y,
        line={"dash": "dash", "color": COLORS["alarm"]},
        annotation_text=f"{alarm_fraction:.0%} free",
        annotation_position="top left",
    )


def free_share_lines(
    lines: Iterable[tuple[str, pd.Series, pd.Series, dict[str, Any]]],
    alarm_fraction: float,
    title: str,
    top: float,
    **layout: Any,
) -> go.Figure:
    """Free blocks as a share of a pool over time, a line per pool (its name, times, shares
    and line style), with the alarm line; the share axis up to `top`."""
    figure = go.Figure()
    for name, times, shares, line in lines:
        figure.add_scatter(x=times, y=shares, name=name, mode="lines", line=line)
    alarm_line(figure, alarm_fraction, alarm_fraction)
    return styled(
        figure,
        title=title,
        xaxis_title="time (s)",
        yaxis={"title": "free blocks", "range": [0, top], "tickformat": ".0%"},
        **layout,
    )


def right_axis(title: str, **axis: Any) -> dict[str, Any]:
    """Layout keys for a second y axis on the right (for a series of another magnitude), with
    the room its title needs."""
    yaxis2 = {
        "title": title,
        "overlaying": "y",
        "tickmode": "auto",
        "side": "right",
        "rangemode": "tozero",
        "showgrid": False,
    }
    return {"yaxis2": yaxis2 | axis, "margin": LAYOUT["margin"] | {"r": 60}}


def time_bars(points: pd.DataFrame, column: str, name: str, color: str, **bar: Any) -> go.Bar:
    """Bars of `column` at each time point (`t_s`) of `points`."""
    return go.Bar(x=points["t_s"], y=points[column], name=name, marker_color=color, **bar)


def time_line(
    points: pd.DataFrame, column: str, name: str, color: str, mode: str = "lines", **line: Any
) -> go.Scatter:
    """A line of `column` over the time points (`t_s`) of `points`."""
    return go.Scatter(
        x=points["t_s"], y=points[column], name=name, mode=mode, line={"color": color}, **line
    )


def two_axes_figure(
    bars: go.Bar, series: go.Scatter, *, title: str, left_title: str, right_title: str, **right: Any
) -> go.Figure:
    """Bars per time point on the left axis, and a series of another magnitude on a right one
    (`right`: that axis's settings beyond `right_axis`'s)."""
    figure = go.Figure([bars, series.update(yaxis="y2")])
    return styled(
        figure,
        title=title,
        xaxis_title="time (s)",
        yaxis={"title": left_title, "rangemode": "tozero"},
        **right_axis(right_title, **right),
    )


def category_colors(labels: Iterable[str]) -> dict[str, str]:
    """A colour per distinct label, picked by the label itself (a stable hash), so a tenant
    or adapter keeps its colour on every chart and in every run; where two labels pick the
    same colour, the later in sorted order takes the next free one. "(none)" and "" are
    grey."""
    distinct = sorted({label for label in labels if label not in ("(none)", "")})
    colors: dict[str, str] = {}
    for label in distinct:
        start = zlib.crc32(label.encode())
        in_turn = (nth_color(start + step) for step in range(len(CATEGORY_COLORS)))
        used = set(colors.values())
        colors[label] = next((color for color in in_turn if color not in used), nth_color(start))
    return colors | {"(none)": NO_LABEL_COLOR, "": NO_LABEL_COLOR}


def nth_color(index: int) -> str:
    """The colour of the index-th run or series."""
    return CATEGORY_COLORS[index % len(CATEGORY_COLORS)]


def table_shade(color: str) -> str:
    """CSS for a table row or cell tinted with `color`."""
    return f"background-color: {color}33"
