"""The prefix tree as an icicle: a node per block (or per unbranched run of blocks), its
width the block's hits, its colour the tenant, the adapter or the age of the block."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from collector.charts.theme import ROOT_COLOR, category_colors, styled
from collector.model.family_names import text_snippet

ROOT_ID = "all"
COLOR_BY = ("tenant", "adapter", "age")
MAX_DEPTH = 6
LABEL_CHARACTERS = 28
HOVER_CHARACTERS = 160


def node_label(first_position: int, last_position: int) -> str:
    """Block positions a node covers: "pos 7" or "pos 0-25"."""
    if first_position == last_position:
        return f"pos {first_position}"
    return f"pos {first_position}-{last_position}"


def tree_depth(nodes: pd.DataFrame) -> int:
    """Levels of nodes below the root (1 when every node is a root's child)."""
    parents = dict(zip(nodes["block_hash"], nodes["parent"], strict=True))
    depths: dict[str, int] = {"": 0}
    for start in nodes["block_hash"]:
        chain, above = [], start
        while above not in depths:  # walk up to a known depth, then fill in on the way down
            chain.append(above)
            above = parents[above]
        for below in reversed(chain):
            depths[below] = depths[parents[below]] + 1
    return max(depths.values())


def _node_colors(
    nodes: pd.DataFrame, categories: pd.Series, color_by: str
) -> tuple[dict[str, object], dict[str, str]]:
    """The icicle's marker (root first), and its colour key: label -> colour, none by age."""
    if color_by == "age":
        scale = {
            "colors": [None, *nodes["first_stored_s"]],
            "colorscale": "Viridis",
            "showscale": True,
            "colorbar": {"title": {"text": "first stored (s)"}},
        }
        return scale, {}
    legend = category_colors(categories)
    return {"colors": [ROOT_COLOR, *(legend[label] for label in categories)]}, legend


def _node_texts(nodes: pd.DataFrame, texts: Sequence[str | None]) -> tuple[list[str], list[str]]:
    """Each node's label (the start of its text, else its positions, and its hits) and the
    more of its text its hover shows."""
    labels = [
        f"{text_snippet(text, LABEL_CHARACTERS) if text else node_label(first, last)}"
        f"<br>{hits:,} hits"
        for first, last, hits, text in zip(
            nodes["first_position"], nodes["block_position"], nodes["hits"], texts, strict=True
        )
    ]
    hover_texts = [
        f"<br>“{text_snippet(text, HOVER_CHARACTERS)}”" if text else "" for text in texts
    ]
    return labels, hover_texts


def prefix_tree_figure(
    nodes: pd.DataFrame,
    color_by: str,
    block_size: int,
    texts: Sequence[str | None] | None = None,
    zoom_to: str | None = None,
) -> go.Figure:
    """Nodes of `prefix_tree.merge_unbranched` (or single blocks, `blocks` = 1) as an icicle
    under one root, each labelled with the start of its text (`texts`, one per node) or, with
    none, its positions; zoomed to the node `zoom_to` (click a node to zoom into it too)."""
    roots = nodes["parent"] == ""
    texts = texts if texts is not None else [None] * len(nodes)
    labels, hover_texts = _node_texts(nodes, texts)
    tenants = nodes["tenant"].fillna("(none)").astype(str)
    adapters = nodes["lora"].fillna("(none)").astype(str)
    tokens = (nodes["block_position"] + 1) * block_size
    categories = tenants if color_by == "tenant" else adapters
    marker, legend = _node_colors(nodes, categories, color_by)
    figure = go.Figure(
        go.Icicle(
            ids=[ROOT_ID, *nodes["block_hash"]],
            parents=["", *nodes["parent"].where(~roots, ROOT_ID)],
            labels=[f"all prefixes<br>{int(nodes.loc[roots, 'hits'].sum()):,} hits", *labels],
            values=[int(nodes.loc[roots, "hits"].sum()), *nodes["hits"]],
            branchvalues="total",
            marker=marker,
            maxdepth=min(MAX_DEPTH, tree_depth(nodes) + 1),
            tiling={"orientation": "h"},
            level=zoom_to if zoom_to in set(nodes["block_hash"]) else ROOT_ID,
            customdata=[
                ["", "", "", 0, ""],
                *zip(nodes["block_hash"], tenants, adapters, tokens, hover_texts, strict=True),
            ],
            hovertemplate=(
                "%{label}<br>block %{customdata[0]}<br>tenant %{customdata[1]}, "
                "adapter %{customdata[2]}<br>prefix of %{customdata[3]} tokens"
                "%{customdata[4]}<extra></extra>"
            ),
        )
    )
    for label, color in legend.items():
        if label and label in set(categories):
            figure.add_scatter(
                x=[None], y=[None], mode="markers", name=label, marker={"color": color, "size": 12}
            )
    return styled(
        figure,
        title=f"Prefix tree: height = hits, colour = {color_by}",
        xaxis={"visible": False},
        yaxis={"visible": False},
        height=620,
        showlegend=bool(legend),
        hovermode="closest",
        margin={"l": 10, "r": 10, "t": 60, "b": 10},
    )
