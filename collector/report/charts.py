"""Comparison charts: pure functions from several runs' query results to Plotly figures.

Each builder takes a mapping from a run's label ("baseline", "candidate", ...) to that run's
data, so the same charts serve the CI report and any page that compares runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from collector.report.figures import tenant_label

RUN_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b")
ALARM_COLOR = "#7f7f7f"
LAYOUT: dict[str, Any] = {
    "template": "plotly_white",
    "margin": {"l": 60, "r": 20, "t": 60, "b": 40},
    "legend": {"orientation": "h", "yanchor": "top", "y": -0.15, "x": 0},
    "height": 420,
}


def hit_ratio_comparison_figure(buckets: Mapping[str, pd.DataFrame]) -> go.Figure:
    """Token hit ratio per time bucket (`hit_rate_over_time`), one line per run."""
    figure = go.Figure()
    for (label, frame), color in zip(buckets.items(), RUN_COLORS, strict=False):
        admitted = frame[frame["requests"] > 0]
        figure.add_scatter(
            x=admitted["t_s"],
            y=admitted["hit_tokens"] / admitted["prompt_tokens"],
            name=label,
            mode="lines+markers",
            line={"color": color},
        )
    figure.update_layout(
        title="Token hit ratio over time",
        xaxis_title="time (s)",
        yaxis={"title": "hit ratio", "range": [0, 1], "tickformat": ".0%"},
        **LAYOUT,
    )
    return figure


def free_blocks_comparison_figure(
    pools: Mapping[str, tuple[pd.DataFrame, int]], alarm_fraction: float = 0.10
) -> go.Figure:
    """Free blocks (cached-but-free included) as a share of each run's usable pool, from
    `pool_timeline`, with the alarm line."""
    figure = go.Figure()
    for (label, (timeline, usable_blocks)), color in zip(pools.items(), RUN_COLORS, strict=False):
        figure.add_scatter(
            x=timeline["t_s"],
            y=timeline["free"] / max(usable_blocks, 1),
            name=f"{label} ({usable_blocks:,} blocks)",
            mode="lines",
            line={"color": color, "width": 1.5},
        )
    figure.add_hline(
        y=alarm_fraction,
        line={"dash": "dash", "color": ALARM_COLOR},
        annotation_text=f"{alarm_fraction:.0%} free",
        annotation_position="top left",
    )
    figure.update_layout(
        title="Free blocks over time (share of the pool)",
        xaxis_title="time (s)",
        yaxis={"title": "free blocks", "range": [0, 1.02], "tickformat": ".0%"},
        **LAYOUT,
    )
    return figure


def evictions_comparison_figure(evictions: Mapping[str, pd.DataFrame]) -> go.Figure:
    """Blocks evicted so far (`event_times(..., "evict")`, summed up), one line per run."""
    figure = go.Figure()
    for (label, frame), color in zip(evictions.items(), RUN_COLORS, strict=False):
        figure.add_scatter(
            x=frame["t_s"],
            y=frame["count"].cumsum(),
            name=label,
            mode="lines",
            line={"color": color, "shape": "hv"},
        )
    figure.update_layout(
        title="Blocks evicted so far",
        xaxis_title="time (s)",
        yaxis_title="evictions",
        **LAYOUT,
    )
    return figure


def tenant_hit_ratio_figure(tenants: Mapping[str, list[dict[str, Any]]]) -> go.Figure:
    """Token hit ratio per tenant (and LoRA adapter), grouped bars, one colour per run."""
    figure = go.Figure()
    for (label, rows), color in zip(tenants.items(), RUN_COLORS, strict=False):
        figure.add_bar(
            x=[tenant_label(row) for row in rows],
            y=[row["hit_ratio"] for row in rows],
            name=label,
            marker_color=color,
            customdata=[row["requests"] for row in rows],
            hovertemplate="%{x}: %{y:.1%} over %{customdata} requests",
        )
    figure.update_layout(
        title="Token hit ratio per tenant",
        xaxis_title="tenant",
        yaxis={"title": "hit ratio", "range": [0, 1], "tickformat": ".0%"},
        barmode="group",
        **LAYOUT,
    )
    return figure
