"""Hotspot charts: the block x time heatmap, the most-hit blocks, how skewed reuse is."""

from __future__ import annotations

import itertools

import pandas as pd
import plotly.graph_objects as go

from collector.charts.theme import COLORS, SECONDS_UNIT, blank_zeros, duration_words, styled

HEAT_SCALES = {"hits": "Greens", "stores": "Blues", "evictions": "Oranges"}


def heatmap_figure(heat: pd.DataFrame, measure: str, block_bin_size: int) -> go.Figure:
    """`measure` (hits, stores or evictions) per block bin (rows) and time point (columns)."""
    grid = heat.pivot_table(
        index="block_start", columns="t_s", values=measure, aggfunc="sum", fill_value=0
    )
    bins = "block" if block_bin_size == 1 else f"{block_bin_size} blocks"
    return _heatmap(
        grid,
        measure,
        title=f"Block {measure} per block id and time (one row per {bins})",
        rows_title="block id",
        hover_row="blocks from %{y}",
    )


def owner_heatmap_figure(heat: pd.DataFrame, measure: str, rows_name: str) -> go.Figure:
    """`measure` per named row (`row`, in `rank` order, the first on top) and time point: a
    prefix family's or a tenant's blocks (`hotspots.owner_heatmap`, rows named)."""
    order = heat.drop_duplicates("row").sort_values("rank")["row"].tolist()
    grid = heat.pivot_table(
        index="row", columns="t_s", values=measure, aggfunc="sum", fill_value=0
    ).reindex(order[::-1])
    return _heatmap(
        grid,
        measure,
        title=f"Block {measure} per {rows_name} and time",
        rows_title=rows_name,
        hover_row="%{y}",
        categorical=True,
    )


def _heatmap(
    grid: pd.DataFrame,
    measure: str,
    *,
    title: str,
    rows_title: str,
    hover_row: str,
    categorical: bool = False,
) -> go.Figure:
    figure = go.Figure(
        go.Heatmap(
            x=grid.columns,
            y=grid.index,
            z=blank_zeros(grid),
            hoverongaps=False,
            colorscale=HEAT_SCALES[measure],
            colorbar={"title": {"text": _per_cell(grid, measure)}},
            meta=SECONDS_UNIT,  # after the hover's time: none once on the wall clock
            hovertemplate=(
                "t = %{x}%{meta}<br>" + hover_row + "<br>%{z} " + measure + "<extra></extra>"
            ),
        )
    )
    return styled(
        figure,
        title=title,
        xaxis={"title": "time (s)", "hoverformat": ",.1f"},  # the hover's t, in seconds
        yaxis={
            "title": rows_title,
            **({"type": "category", "automargin": True} if categorical else {}),
        },
        hovermode="closest",
    )


def _per_cell(grid: pd.DataFrame, measure: str) -> str:
    """The colour bar's title, naming a cell's width in time: "hits per 1.2 s"."""
    times = sorted(float(time) for time in grid.columns)
    steps = [later - earlier for earlier, later in itertools.pairwise(times)]
    return f"{measure} per {duration_words(min(steps))}" if steps else measure


TOP_TITLES = {"hits": "Most-hit", "stores": "Most-stored", "evictions": "Most-evicted"}
TOP_COLORS = {
    "hits": COLORS["tokens"],
    "stores": COLORS["blocks"],
    "evictions": COLORS["evictions"],
}


def top_blocks_figure(top: pd.DataFrame, measure: str = "hits") -> go.Figure:
    """The blocks with the most `measure` (hits, stores or evictions) as horizontal bars, the
    most on top, a bar per run of blocks alike (`label`: their family and positions, from
    `visualizer.views.hotspots`' grouping); the hover gives the other counts and the first
    block's hash."""
    figure = go.Figure(
        go.Bar(
            x=top[measure],
            y=top["label"],
            orientation="h",
            marker_color=TOP_COLORS[measure],
            customdata=top[["tenant", "hits", "stores", "evictions", "blocks", "first_hash"]]
            .astype(str)
            .to_numpy(),
            hovertemplate=(
                "%{y}<br>%{customdata[4]} blocks alike, each: %{customdata[1]} hits, "
                "%{customdata[2]} stores, %{customdata[3]} evictions<br>tenant "
                "%{customdata[0]}, first block %{customdata[5]}<extra></extra>"
            ),
        )
    )
    return styled(
        figure,
        title=f"{TOP_TITLES[measure]} cached blocks",
        xaxis_title=f"{measure} per block",
        yaxis_title="prefix family · positions in the prompt",
        yaxis={"autorange": "reversed", "type": "category"},
        height=max(320, 24 * len(top) + 120),
        hovermode="closest",
        margin={"l": 140, "r": 20, "t": 60, "b": 40},
    )


def hit_histogram_figure(histogram: pd.DataFrame) -> go.Figure:
    """How many cached blocks got 0, 1, 2, 3-4, ... hits while cached (log scale: reuse is
    skewed)."""
    figure = go.Figure(
        go.Bar(
            x=histogram["bin"],
            y=histogram["blocks"],
            marker_color=COLORS["blocks"],
            customdata=histogram["hits"],
            hovertemplate="%{x} hits: %{y} cached blocks (%{customdata} hits)<extra></extra>",
        )
    )
    return styled(
        figure,
        title="Hit-count distribution",
        xaxis={"title": "hits while cached", "type": "category"},
        yaxis={"title": "cached blocks (log scale)", "type": "log", "dtick": 1},
        hovermode="closest",
    )


def concentration_figure(frequencies: pd.DataFrame) -> go.Figure:
    """Share of all hits taken by the most-hit share of cached blocks (a Lorenz-style
    curve)."""
    ordered = frequencies.sort_values("hits", ascending=False)
    blocks = ordered["blocks"].cumsum() / ordered["blocks"].sum()
    total_hits = (ordered["hits"] * ordered["blocks"]).sum()
    hits = (ordered["hits"] * ordered["blocks"]).cumsum() / (total_hits or 1)
    figure = go.Figure()
    figure.add_scatter(
        x=[0.0, *blocks],
        y=[0.0, *hits],
        mode="lines",
        name="this window",
        line={"color": COLORS["blocks"]},
        hovertemplate="top %{x:.1%} of blocks: %{y:.1%} of hits<extra></extra>",
    )
    figure.add_scatter(
        x=[0, 1],
        y=[0, 1],
        mode="lines",
        name="even reuse",
        line={"color": COLORS["alarm"], "dash": "dash"},
    )
    return styled(
        figure,
        title="How concentrated reuse is",
        xaxis={"title": "most-hit share of cached blocks", "tickformat": ".0%"},
        yaxis={"title": "share of all hits", "tickformat": ".0%", "range": [0, 1.02]},
        hovermode="closest",
    )
