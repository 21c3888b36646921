"""Chart builders for vLLM's own KV events: pure functions from query results to figures."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from collector.charts.theme import BROWN, COLORS, GREEN, GREY, styled

# Where vLLM holds a block, as its events name it, and as the page says it.
MEDIUM_NAMES = {"GPU": "GPU pool", "CPU": "CPU tier", "STORAGE": "storage tier"}
MEDIUM_COLORS = {"GPU": COLORS["cached_free"], "CPU": GREEN, "STORAGE": BROWN}


def medium_name(medium: str) -> str:
    """A medium as the page names it: "GPU pool", "CPU tier" (one vLLM adds: "X tier")."""
    return MEDIUM_NAMES.get(medium, f"{medium} tier")


def vllm_kv_activity_figure(
    activity: pd.DataFrame, title: str = "What vLLM's KV events reported over time"
) -> go.Figure:
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
        title=title,
        xaxis_title="time since the first batch (s)",
        yaxis_title="blocks (removed below zero)",
        barmode="relative",
    )


def vllm_kv_tier_occupancy_figure(occupancy: pd.DataFrame) -> go.Figure:
    """Blocks held at the end of each time bucket, one step line per medium (GPU first)."""
    figure = go.Figure()
    for medium, series in occupancy.groupby("medium", sort=False):
        figure.add_scatter(
            x=series["t_s"],
            y=series["blocks_held"],
            name=medium_name(str(medium)),
            mode="lines",
            line={"shape": "hv", "color": MEDIUM_COLORS.get(str(medium), GREY)},
        )
    return styled(
        figure,
        title="Blocks held by the GPU pool and each offload tier",
        xaxis_title="time since the first batch (s)",
        yaxis={"title": "blocks held", "rangemode": "tozero"},
    )
