"""Collision chart: hits checked per point and the collisions found among them."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from collector.charts.theme import COLORS, per_point, time_bars, two_axes_figure


def collision_checks_figure(points: pd.DataFrame, hash_algo: str) -> go.Figure:
    """Block hits checked per point (bars) and collisions found (red markers)."""
    found = int(points["collisions"].sum())
    checked = int(points["block_hits"].sum())
    found_points = points[points["collisions"] > 0]
    most = max(int(points["collisions"].max()), 1)
    return two_axes_figure(
        time_bars(points, "block_hits", "block hits checked", COLORS["cached_free"]),
        go.Scatter(
            x=found_points["t_s"],
            y=found_points["collisions"],
            name="collisions found",
            mode="markers",
            marker={"color": COLORS["in_use"], "size": 9, "symbol": "x"},
        ),
        title=f"{found:,} collisions in {checked:,} block hits checked ({hash_algo})",
        left_title=per_point(points, "block hits"),
        right_title="collisions",
        range=[0, most * 1.1],
        tickmode="linear",
        tick0=0,
        dtick=max(most // 5, 1),
    )
