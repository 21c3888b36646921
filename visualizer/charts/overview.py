"""Overview charts beyond the hit ratio: block events and the run's integrity over time."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from visualizer.charts import COLORS, LAYOUT


def block_events_figure(points: pd.DataFrame) -> go.Figure:
    """Block hits, stores and evictions per point of `activity.figures_over_time`."""
    figure = go.Figure()
    for column, name, color in (
        ("block_hits", "block hits", COLORS["tokens"]),
        ("stores", "blocks stored", COLORS["cached_free"]),
        ("evictions", "blocks evicted", COLORS["evictions"]),
    ):
        figure.add_scatter(
            x=points["t_s"], y=points[column], name=name, mode="lines", line={"color": color}
        )
    figure.update_layout(
        title="Block hits, stores, evictions",
        xaxis_title="time (s)",
        yaxis_title="blocks per point",
        **LAYOUT,
    )
    return figure


def tokens_saved_figure(points: pd.DataFrame) -> go.Figure:
    """Prompt tokens served from the cache and computed, per point, stacked."""
    figure = go.Figure()
    figure.add_bar(
        x=points["t_s"],
        y=points["hit_tokens"],
        name="served from the prefix cache",
        marker_color=COLORS["tokens"],
    )
    figure.add_bar(
        x=points["t_s"],
        y=points["prompt_tokens"] - points["hit_tokens"],
        name="computed (prefill)",
        marker_color=COLORS["free_uncached"],
    )
    figure.update_layout(
        title="Prompt tokens: cached vs computed",
        xaxis_title="time (s)",
        yaxis_title="tokens per point",
        barmode="stack",
        **LAYOUT,
    )
    return figure


def integrity_figure(points: pd.DataFrame) -> go.Figure:
    """Collisions and dropped events per point; a flat zero line is the good result."""
    collisions, dropped = int(points["collisions"].sum()), int(points["dropped_events"].sum())
    highest = max(int(points["collisions"].max()), int(points["dropped_events"].max()), 1)
    figure = go.Figure()
    figure.add_scatter(
        x=points["t_s"],
        y=points["collisions"],
        name="collisions",
        mode="lines+markers",
        line={"color": COLORS["in_use"]},
    )
    figure.add_scatter(
        x=points["t_s"],
        y=points["dropped_events"],
        name="dropped events",
        mode="lines+markers",
        line={"color": COLORS["alarm"], "dash": "dot"},
    )
    figure.update_layout(
        title=f"Integrity: {collisions:,} collisions, {dropped:,} dropped events",
        xaxis_title="time (s)",
        yaxis={"title": "per point", "range": [0, highest * 1.1]},
        height=380,
        **{**LAYOUT, "legend": {"orientation": "h", "yanchor": "top", "y": -0.3, "x": 0}},
    )
    return figure
