"""Run-versus-run charts, for the Compare runs page and the CI report.

Each builder of series over time takes a mapping from a run's label ("baseline", a file
name, ...) to that run's data, one line (or bar group) per run in the mapping's order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from collector.charts.theme import (
    COLORS,
    RATIO_AXIS,
    RUN_DASHES,
    VERDICT_COLORS,
    free_share_lines,
    nth_color,
    styled,
)
from collector.queries.tenants import TenantHitRatio, tenant_label

HEIGHT = 420


def _run_line(index: int, **line: Any) -> dict[str, Any]:
    """The index-th run's line: its own colour and dash."""
    return {"color": nth_color(index), "dash": RUN_DASHES[index % len(RUN_DASHES)], **line}


def hit_ratio_comparison_figure(buckets: Mapping[str, pd.DataFrame]) -> go.Figure:
    """Token hit ratio per time bucket (`figures_over_time` or `hit_rate_over_time`), one line
    per run; buckets with no admitted request are gaps."""
    figure = go.Figure()
    for index, (label, frame) in enumerate(buckets.items()):
        admitted = frame[frame["requests"] > 0]
        figure.add_scatter(
            x=admitted["t_s"],
            y=admitted["hit_tokens"] / admitted["prompt_tokens"],
            name=label,
            mode="lines+markers",
            line=_run_line(index),
        )
    return styled(
        figure,
        title="Token hit ratio over time",
        xaxis_title="time (s)",
        yaxis=RATIO_AXIS,
        height=HEIGHT,
    )


def free_blocks_comparison_figure(
    pools: Mapping[str, tuple[pd.DataFrame, int]], alarm_fraction: float = 0.10
) -> go.Figure:
    """Free blocks (cached-but-free included) as a share of each run's usable pool, from
    `pool_timeline`, with the alarm line."""
    lines = [
        (
            f"{label} ({usable_blocks:,} blocks)",
            timeline["t_s"],
            timeline["free"] / max(usable_blocks, 1),
            _run_line(index, width=1.5),
        )
        for index, (label, (timeline, usable_blocks)) in enumerate(pools.items())
    ]
    title = "Free blocks over time (share of the pool)"
    return free_share_lines(lines, alarm_fraction, title, 1.02, height=HEIGHT)


def evictions_comparison_figure(evictions: Mapping[str, pd.DataFrame]) -> go.Figure:
    """Blocks evicted so far (`event_times(..., "evict")`, summed up), one line per run."""
    figure = go.Figure()
    for index, (label, frame) in enumerate(evictions.items()):
        figure.add_scatter(
            x=frame["t_s"],
            y=frame["count"].cumsum(),
            name=label,
            mode="lines",
            line=_run_line(index, shape="hv"),
        )
    return styled(
        figure,
        title="Blocks evicted so far",
        xaxis_title="time (s)",
        yaxis_title="evictions",
        height=HEIGHT,
    )


def tenant_hit_ratio_figure(tenants: Mapping[str, list[TenantHitRatio]]) -> go.Figure:
    """Token hit ratio per tenant (and LoRA adapter), grouped bars, one colour per run."""
    figure = go.Figure()
    for index, (label, rows) in enumerate(tenants.items()):
        figure.add_bar(
            x=[tenant_label(row) for row in rows],
            y=[row.hit_ratio for row in rows],
            name=label,
            marker_color=nth_color(index),
            customdata=[row.requests for row in rows],
            hovertemplate="%{x}: %{y:.1%} over %{customdata} requests",
        )
    return styled(
        figure,
        title="Token hit ratio per tenant",
        xaxis_title="tenant",
        yaxis=RATIO_AXIS,
        barmode="group",
        height=HEIGHT,
        hovermode="closest",
    )


def deltas_figure(comparison: pd.DataFrame) -> go.Figure:
    """Each figure's relative change from the first run to the second, coloured by verdict;
    changes within their figure's floor (`small`: 1 -> 4 preemptions) are left out of the
    bars and named in the title, so they do not dwarf the changes that matter."""
    changed = comparison[comparison["relative_delta"].notna()]
    rows = changed[~changed["small"]]
    small = changed[changed["small"]]
    title = "Change, second run vs first"
    if not small.empty:
        named = [
            f"{row['label']} ({_shown(row['first'], row['unit'])} -> "
            f"{_shown(row['second'], row['unit'])})"
            for row in small.to_dict("records")
        ]
        title += f"<br><sup>too small to call, left out: {', '.join(named)}</sup>"
    figure = go.Figure(
        go.Bar(
            x=rows["relative_delta"],
            y=rows["label"],
            orientation="h",
            marker_color=[VERDICT_COLORS[verdict] for verdict in rows["verdict"]],
            customdata=rows[["first", "second", "verdict"]].astype(str).to_numpy(),
            hovertemplate=(
                "%{y}: %{x:+.1%}<br>%{customdata[0]} -> %{customdata[1]} "
                "(%{customdata[2]})<extra></extra>"
            ),
        )
    )
    figure.add_vline(x=0, line={"color": COLORS["alarm"]})
    return styled(
        figure,
        title=title,
        xaxis={"title": "relative change", "tickformat": "+.0%"},
        yaxis={"autorange": "reversed", "type": "category"},
        height=max(320, 30 * len(rows) + 120),
        hovermode="closest",
        margin={"l": 150, "r": 20, "t": 60, "b": 40},
    )


def _shown(value: float, unit: str) -> str:
    """A figure's value as the title shows it: a ratio as a percentage, a count with commas."""
    return f"{value:.1%}" if unit == "ratio" else f"{value:,.0f}"
