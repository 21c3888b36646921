"""Tenant and adapter charts: hits per tenant, blocks held, and who hits whose blocks."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from collector.charts.theme import COLORS, right_axis, styled


def usage_label(usage: pd.DataFrame) -> pd.Series:
    """The tenant, and the adapter under it when there is one, per row."""
    return usage["tenant"].where(
        usage["lora"] == "(none)", usage["tenant"] + "<br>" + usage["lora"]
    )


def tenant_tokens_figure(usage: pd.DataFrame) -> go.Figure:
    """Prompt tokens per tenant and adapter: served from the cache vs computed."""
    labels = usage_label(usage)
    figure = go.Figure()
    figure.add_bar(
        x=labels,
        y=usage["hit_tokens"],
        name="served from the prefix cache",
        marker_color=COLORS["tokens"],
        customdata=usage["hit_ratio"],
        hovertemplate="%{x}: %{y:,} hit tokens (%{customdata:.1%})<extra></extra>",
    )
    figure.add_bar(
        x=labels,
        y=usage["prompt_tokens"] - usage["hit_tokens"],
        name="computed",
        marker_color=COLORS["free_uncached"],
    )
    return styled(
        figure,
        title="Prompt tokens per tenant",
        xaxis={"title": "", "type": "category"},
        yaxis_title="tokens",
        barmode="stack",
        hovermode="closest",
    )


def blocks_held_figure(usage: pd.DataFrame) -> go.Figure:
    """Blocks each tenant and adapter held in the cache on average, and blocks it stored."""
    labels = usage_label(usage)
    figure = go.Figure()
    figure.add_bar(
        x=labels,
        y=usage["mean_blocks_held"],
        name="cached blocks held (mean)",
        marker_color=COLORS["cached_free"],
        offsetgroup=0,
    )
    figure.add_bar(
        x=labels,
        y=usage["blocks_stored"],
        name="blocks stored",
        marker_color=COLORS["blocks"],
        yaxis="y2",
        offsetgroup=1,
    )
    return styled(
        figure,
        title="Cache held and filled per tenant",
        xaxis={"title": "", "type": "category"},
        yaxis={"title": "blocks held (mean)", "rangemode": "tozero"},
        barmode="group",
        hovermode="closest",
        **right_axis("blocks stored"),
    )


def sharing_figure(cross: pd.DataFrame) -> go.Figure:
    """Block hits per storing tenant (rows) x hitting tenant (columns): off the diagonal, one
    tenant was served another's cached blocks."""
    grid = cross.pivot_table(
        index="stored_tenant",
        columns="hit_tenant",
        values="block_hits",
        aggfunc="sum",
        fill_value=0,
    )
    figure = go.Figure(
        go.Heatmap(
            x=grid.columns,
            y=grid.index,
            z=grid.to_numpy(),
            colorscale="Blues",
            text=grid.to_numpy(),
            texttemplate="%{text:,}",
            hovertemplate=("blocks stored by %{y}, hit by %{x}: %{z:,} block hits<extra></extra>"),
            colorbar={"title": {"text": "block hits"}},
        )
    )
    return styled(
        figure,
        title="Who hits whose cached blocks",
        xaxis={"title": "hit by tenant", "type": "category"},
        yaxis={"title": "stored by tenant", "type": "category"},
        height=max(320, 70 * len(grid.index) + 160),
        hovermode="closest",
    )
