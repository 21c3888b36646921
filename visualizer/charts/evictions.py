"""What evicts what: evictions by evicting x evicted prefix family or tenant, as a matrix."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from collector.charts.theme import blank_zeros, styled

OTHERS = "(others)"


def top_cells(cells: pd.DataFrame, limit: int) -> pd.DataFrame:
    """Cells (evicting, evicted, evictions: labels and counts) with the rows and columns
    past the `limit` that evicted, or lost, the most folded into one "(others)" each."""
    kept = {side: set(_by_total(cells, side)[:limit]) for side in ("evicting", "evicted")}
    folded = cells.assign(
        evicting=cells["evicting"].where(cells["evicting"].isin(kept["evicting"]), OTHERS),
        evicted=cells["evicted"].where(cells["evicted"].isin(kept["evicted"]), OTHERS),
    )
    return folded.groupby(["evicting", "evicted"], sort=False)["evictions"].sum().reset_index()


def eviction_matrix_figure(cells: pd.DataFrame, title: str) -> go.Figure:
    """Evicted blocks per evicting row and evicted column (labels in `cells`), the most
    evicting on top and the most evicted on the left; a pair that evicted nothing is left
    blank, not tinted."""
    rows = _ordered(cells, "evicting")
    columns = _ordered(cells, "evicted")
    grid = cells.pivot_table(
        index="evicting", columns="evicted", values="evictions", aggfunc="sum"
    ).reindex(index=rows, columns=columns)
    counts = blank_zeros(grid)
    text = [["" if np.isnan(value) else f"{value:,.0f}" for value in row] for row in counts]
    figure = go.Figure(
        go.Heatmap(
            x=columns,
            y=rows,
            z=counts,
            text=text,
            texttemplate="%{text}",
            colorscale="Oranges",
            colorbar={"title": {"text": "blocks"}},
            hoverongaps=False,
            hovertemplate="%{y} evicted %{z:,} blocks of %{x}<extra></extra>",
        )
    )
    return styled(
        figure,
        title=title,
        xaxis={"title": "evicted (whose blocks were lost)", "type": "category"},
        yaxis={
            "title": "evicting (whose allocation took them)",
            "type": "category",
            "autorange": "reversed",
            "automargin": True,
        },
        height=max(360, 40 * len(rows) + 200),
        hovermode="closest",
    )


def _ordered(cells: pd.DataFrame, side: str) -> list[str]:
    """The labels of one side, most evictions first, "(others)" last."""
    labels = _by_total(cells, side)
    return [label for label in labels if label != OTHERS] + [
        label for label in labels if label == OTHERS
    ]


def _by_total(cells: pd.DataFrame, side: str) -> list[str]:
    """The labels of one side, most evictions first (ties in the frame's order)."""
    totals = cells.groupby(side, sort=False)["evictions"].sum()
    return [str(label) for label in totals.sort_values(ascending=False, kind="stable").index]
