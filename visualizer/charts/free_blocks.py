"""The free-block timeline: the pool's blocks by state over time, and what happened to it."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from collector.charts.theme import COLORS, alarm_line, styled

POOL_STATES = (
    ("in_use", "in use"),
    ("cached_free", "cached but free (evictable)"),
    ("free_uncached", "free, no cached content"),
)


def free_blocks_figure(
    timeline: pd.DataFrame,
    *,
    evictions: pd.DataFrame,
    preemptions: pd.DataFrame,
    low_periods: pd.DataFrame,
    num_usable_blocks: int,
    alarm_fraction: float = 0.10,
) -> go.Figure:
    """Blocks in use, cached-but-free and free over time, evictions and preemptions marked,
    the alarm line, and the stretches spent under it shaded."""
    figure = go.Figure()
    for column, name in POOL_STATES:
        figure.add_scatter(
            x=timeline["t_s"],
            y=timeline[column],
            name=name,
            stackgroup="pool",
            mode="lines",
            line={"width": 0.5, "color": COLORS[column]},
        )
    alarm = alarm_fraction * num_usable_blocks
    alarm_line(figure, num_usable_blocks - alarm, alarm_fraction)
    for period in low_periods.itertuples():
        figure.add_vrect(
            x0=period.start_s,
            x1=period.end_s,
            fillcolor=COLORS["in_use"],
            opacity=0.12,
            line_width=0,
        )
    # Markers above the pool: evictions just over it (sized by how many), preemptions over
    # those.
    for marks, name, verb, height, symbol, size in (
        (evictions, "evictions", "evicted", 1.03, "triangle-down", _sized(evictions)),
        (preemptions, "preemptions", "preempted", 1.07, "x", 9),
    ):
        if marks.empty:
            continue
        figure.add_scatter(
            x=marks["t_s"],
            y=[num_usable_blocks * height] * len(marks),
            name=name,
            mode="markers",
            marker={"symbol": symbol, "color": COLORS[name], "size": size},
            customdata=marks["count"],
            hovertemplate=f"%{{customdata}} {verb}<extra></extra>",
        )
    return styled(
        figure,
        title="KV cache blocks over time",
        xaxis_title="time (s)",
        yaxis={"title": "blocks", "range": [0, num_usable_blocks * 1.1]},
    )


def _sized(marks: pd.DataFrame) -> list[float]:
    """Marker sizes from 4 to 14 pixels by the square root of each mark's count."""
    if marks.empty:
        return []
    counts = marks["count"].astype(float)
    return (4 + 10 * (counts / counts.max()) ** 0.5).round(1).tolist()
