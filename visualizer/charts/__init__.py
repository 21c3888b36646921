"""Chart builders: pure functions from query results to Plotly figures."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

COLORS = {
    "in_use": "#d62728",
    "cached_free": "#1f77b4",
    "free_uncached": "#aec7e8",
    "tokens": "#2ca02c",
    "blocks": "#9467bd",
    "evictions": "#ff7f0e",
    "alarm": "#7f7f7f",
}
LAYOUT = {
    "template": "plotly_white",
    "margin": {"l": 60, "r": 20, "t": 60, "b": 40},
    "legend": {"orientation": "h", "yanchor": "top", "y": -0.15, "x": 0},
    "hovermode": "x unified",
}


def hit_rate_figure(buckets: pd.DataFrame) -> go.Figure:
    """Token and block hit ratio per time bucket (buckets with no admitted request are gaps)."""
    admitted = buckets[buckets["requests"] > 0]
    figure = go.Figure()
    figure.add_scatter(
        x=admitted["t_s"],
        y=admitted["hit_tokens"] / admitted["prompt_tokens"],
        name="by tokens",
        mode="lines+markers",
        line={"color": COLORS["tokens"]},
    )
    figure.add_scatter(
        x=admitted["t_s"],
        y=admitted["hit_blocks"] / admitted["prompt_blocks"],
        name="by blocks",
        mode="lines+markers",
        line={"color": COLORS["blocks"], "dash": "dot"},
    )
    figure.update_layout(
        title="Prefix-cache hit ratio over time",
        xaxis_title="time (s)",
        yaxis={"title": "hit ratio", "range": [0, 1], "tickformat": ".0%"},
        **LAYOUT,
    )
    return figure


def activity_figure(buckets: pd.DataFrame) -> go.Figure:
    """Blocks evicted (bars) and requests admitted (line, right axis) per time bucket: the
    two differ by orders of magnitude, so each gets its own axis."""
    figure = go.Figure()
    figure.add_bar(
        x=buckets["t_s"],
        y=buckets["evictions"],
        name="blocks evicted",
        marker_color=COLORS["evictions"],
    )
    figure.add_scatter(
        x=buckets["t_s"],
        y=buckets["requests"],
        name="requests admitted",
        mode="lines+markers",
        line={"color": COLORS["tokens"]},
        yaxis="y2",
    )
    figure.update_layout(
        title="Requests and evictions over time",
        xaxis_title="time (s)",
        yaxis={"title": "blocks evicted per bucket", "rangemode": "tozero"},
        yaxis2={
            "title": "requests per bucket",
            "overlaying": "y",
            "tickmode": "auto",
            "side": "right",
            "rangemode": "tozero",
            "showgrid": False,
        },
        **{**LAYOUT, "margin": {"l": 60, "r": 60, "t": 60, "b": 40}},
    )
    return figure


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
    for column, name in (
        ("in_use", "in use"),
        ("cached_free", "cached but free (evictable)"),
        ("free_uncached", "free, no cached content"),
    ):
        figure.add_scatter(
            x=timeline["t_s"],
            y=timeline[column],
            name=name,
            stackgroup="pool",
            mode="lines",
            line={"width": 0.5, "color": COLORS[column]},
        )
    alarm = alarm_fraction * num_usable_blocks
    figure.add_hline(
        y=num_usable_blocks - alarm,
        line={"dash": "dash", "color": COLORS["alarm"]},
        annotation_text=f"{alarm_fraction:.0%} free",
        annotation_position="top left",
    )
    for period in low_periods.itertuples():
        figure.add_vrect(
            x0=period.start_s,
            x1=period.end_s,
            fillcolor=COLORS["in_use"],
            opacity=0.12,
            line_width=0,
        )
    if not evictions.empty:
        figure.add_scatter(
            x=evictions["t_s"],
            y=[num_usable_blocks * 1.03] * len(evictions),
            name="evictions",
            mode="markers",
            marker={"symbol": "triangle-down", "color": COLORS["evictions"], "size": 7},
            customdata=evictions["count"],
            hovertemplate="%{customdata} evicted<extra></extra>",
        )
    if not preemptions.empty:
        figure.add_scatter(
            x=preemptions["t_s"],
            y=[num_usable_blocks * 1.07] * len(preemptions),
            name="preemptions",
            mode="markers",
            marker={"symbol": "x", "color": "black", "size": 9},
            customdata=preemptions["count"],
            hovertemplate="%{customdata} preempted<extra></extra>",
        )
    figure.update_layout(
        title="KV cache blocks over time",
        xaxis_title="time (s)",
        yaxis={"title": "blocks", "range": [0, num_usable_blocks * 1.1]},
        **LAYOUT,
    )
    return figure
