"""Collision chart: hits checked per point and the collisions found among them."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from visualizer.charts import COLORS, LAYOUT


def collision_checks_figure(points: pd.DataFrame, hash_algo: str) -> go.Figure:
    """Block hits checked per point (bars) and collisions found (red markers)."""
    found = int(points["collisions"].sum())
    checked = int(points["block_hits"].sum())
    figure = go.Figure()
    figure.add_bar(
        x=points["t_s"],
        y=points["block_hits"],
        name="block hits checked",
        marker_color=COLORS["cached_free"],
    )
    found_points = points[points["collisions"] > 0]
    figure.add_scatter(
        x=found_points["t_s"],
        y=found_points["collisions"],
        name="collisions found",
        mode="markers",
        marker={"color": COLORS["in_use"], "size": 9, "symbol": "x"},
        yaxis="y2",
    )
    figure.update_layout(
        title=f"{found:,} collisions in {checked:,} block hits checked ({hash_algo})",
        xaxis_title="time (s)",
        yaxis={"title": "block hits per point", "rangemode": "tozero"},
        yaxis2={
            "title": "collisions",
            "overlaying": "y",
            "side": "right",
            "range": [0, max(int(points["collisions"].max()), 1) * 1.1],
            "tickmode": "linear",
            "tick0": 0,
            "dtick": max(int(points["collisions"].max()) // 5, 1),
            "showgrid": False,
        },
        **{**LAYOUT, "margin": {"l": 60, "r": 60, "t": 60, "b": 40}},
    )
    return figure
