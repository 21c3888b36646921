"""Latency by hit share: TTFT and queue time percentiles per bucket of how much of each
prompt the cache held."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from collector.charts.theme import BLUE, GREY, LIGHT_BLUE, styled


def latency_by_hit_share_figure(table: pd.DataFrame, clock: str) -> go.Figure:
    """p50 and p90 TTFT (bars) and p50 queue time (grey bars) per hit share bucket, in
    milliseconds; `clock` ("measured", "modelled") is in the title."""
    figure = go.Figure()
    for column, name, color in (
        ("p50_ttft_ms", "p50 TTFT", BLUE),
        ("p90_ttft_ms", "p90 TTFT", LIGHT_BLUE),
        ("p50_queue_ms", "p50 queue time", GREY),
    ):
        figure.add_bar(
            x=table["hit_share"],
            y=table[column],
            name=name,
            marker_color=color,
            customdata=table["requests"],
            hovertemplate="%{y:,.1f} ms (%{customdata:,} requests)",
        )
    return styled(
        figure,
        title=f"Time to first token by hit share ({clock})",
        xaxis_title="share of the prompt cached",
        yaxis_title="milliseconds",
        barmode="group",
    )
