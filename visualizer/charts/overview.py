"""Overview charts: hit ratio, requests and evictions, block events, tokens saved and the run's
integrity over time."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from collector.charts.theme import (
    COLORS,
    LAYOUT,
    RATIO_AXIS,
    per_point,
    styled,
    time_bars,
    time_line,
    two_axes_figure,
)


def hit_rate_figure(buckets: pd.DataFrame) -> go.Figure:
    """Token and block hit ratio per time bucket (buckets with no admitted request are gaps)."""
    admitted = buckets[buckets["requests"] > 0]
    figure = go.Figure()
    for unit, name, line in (
        ("tokens", "by tokens", {"color": COLORS["tokens"]}),
        ("blocks", "by blocks", {"color": COLORS["blocks"], "dash": "dot"}),
    ):
        ratio = admitted[f"hit_{unit}"] / admitted[f"prompt_{unit}"]
        figure.add_scatter(x=admitted["t_s"], y=ratio, name=name, mode="lines+markers", line=line)
    return styled(
        figure,
        title="Prefix-cache hit ratio over time",
        xaxis_title="time (s)",
        yaxis=RATIO_AXIS,
    )


def activity_figure(buckets: pd.DataFrame) -> go.Figure:
    """Blocks evicted (bars) and requests admitted (line, right axis) per time bucket: the
    two differ by orders of magnitude, so each gets its own axis."""
    return two_axes_figure(
        time_bars(buckets, "evictions", "blocks evicted", COLORS["evictions"]),
        time_line(buckets, "requests", "requests admitted", COLORS["tokens"], "lines+markers"),
        title="Requests and evictions over time",
        left_title=per_point(buckets, "blocks evicted"),
        right_title=per_point(buckets, "requests"),
    )


def block_events_figure(points: pd.DataFrame) -> go.Figure:
    """Block hits, stores and evictions per point of `activity.figures_over_time`."""
    figure = go.Figure()
    # Stores dashed and drawn last: in a full pool they run level with evictions, and a
    # solid line on top would hide the other.
    for column, name, line in (
        ("block_hits", "block hits", {"color": COLORS["tokens"]}),
        ("evictions", "blocks evicted", {"color": COLORS["evictions"]}),
        ("stores", "blocks stored", {"color": COLORS["cached_free"], "dash": "dash"}),
    ):
        figure.add_scatter(x=points["t_s"], y=points[column], name=name, mode="lines", line=line)
    return styled(
        figure,
        title="Block hits, stores, evictions",
        xaxis_title="time (s)",
        yaxis_title=per_point(points, "blocks"),
    )


def tokens_saved_figure(points: pd.DataFrame) -> go.Figure:
    """Prompt tokens served from the cache, loaded back from an offload tier (a run with one)
    and computed, per point, stacked."""
    tier = points["tier_hit_tokens"]
    computed = points["prompt_tokens"] - points["hit_tokens"] - tier
    series = [(points["hit_tokens"], "served from the prefix cache", COLORS["tokens"])]
    if tier.any():
        series.append((tier, "loaded from the CPU tier", COLORS["cached_free"]))
    series.append((computed, "computed (prefill)", COLORS["free_uncached"]))
    figure = go.Figure()
    for tokens, name, color in series:
        figure.add_bar(x=points["t_s"], y=tokens, name=name, marker_color=color)
    return styled(
        figure,
        title="Prompt tokens: cached vs computed",
        xaxis_title="time (s)",
        yaxis_title=per_point(points, "tokens"),
        barmode="stack",
    )


def integrity_figure(points: pd.DataFrame) -> go.Figure:
    """Collisions and dropped events per point; a flat zero line is the good result."""
    collisions, dropped = int(points["collisions"].sum()), int(points["dropped_events"].sum())
    highest = max(int(points["collisions"].max()), int(points["dropped_events"].max()), 1)
    figure = go.Figure()
    for column, name, line in (
        ("collisions", "collisions", {"color": COLORS["in_use"]}),
        ("dropped_events", "dropped events", {"color": COLORS["alarm"], "dash": "dot"}),
    ):
        figure.add_scatter(
            x=points["t_s"], y=points[column], name=name, mode="lines+markers", line=line
        )
    return styled(
        figure,
        title=f"Integrity: {collisions:,} collisions, {dropped:,} dropped events",
        xaxis_title="time (s)",
        yaxis={"title": per_point(points, "count"), "range": [0, highest * 1.1]},
        height=380,
        legend=LAYOUT["legend"] | {"y": -0.3},
    )


def with_markers(figure: go.Figure, markers: pd.DataFrame) -> go.Figure:
    """The figure with a dotted vertical line at each marker's `t_s`, named by its `label`
    (where engines started: the run's settings may have changed there)."""
    for t_s, label in zip(markers["t_s"], markers["label"], strict=True):
        figure.add_vline(
            x=t_s,
            line={"color": COLORS["alarm"], "dash": "dot", "width": 1},
            annotation_text=label,
            annotation_position="top left",
        )
    return figure
