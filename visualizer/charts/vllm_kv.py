"""Chart builders for vLLM's own KV events: pure functions from query results to figures."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from visualizer.charts.theme import COLORS, styled


def vllm_kv_activity_figure(activity: pd.DataFrame) -> go.Figure:
    """Blocks stored (up) and removed (down) per time bucket; whole-cache clears as lines."""
    figure = go.Figure()
    figure.add_bar(
        x=activity["t_s"], y=activity["stored"], name="blocks stored", marker_color=COLORS["tokens"]
    )
    figure.add_bar(
        x=activity["t_s"],
        y=-activity["removed"],
        name="blocks removed",
        marker_color=COLORS["evictions"],
        customdata=activity["removed"],
        hovertemplate="%{customdata}",
    )
    for t_s in activity.loc[activity["cleared"] > 0, "t_s"]:
        figure.add_vline(
            x=t_s,
            line={"color": COLORS["alarm"], "dash": "dash"},
            annotation_text="cache cleared",
        )
    return styled(
        figure,
        title="What vLLM's KV events reported over time",
        xaxis_title="time since the first batch (s)",
        yaxis_title="blocks (removed below zero)",
        barmode="relative",
    )
