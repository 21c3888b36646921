"""The prefix tree as an icicle: a node per block (or per unbranched run of blocks), its
width the block's hits, its colour the tenant, the adapter or the age of the block."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from visualizer.charts.theme import ROOT_COLOR, category_colors, styled

ROOT_ID = "all"
COLOR_BY = ("tenant", "adapter", "age")
MAX_DEPTH = 6


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


def prefix_tree_figure(nodes: pd.DataFrame, color_by: str, block_size: int) -> go.Figure:
    """Nodes of `prefix_tree.merge_unbranched` (or single blocks, `blocks` = 1) as an icicle
    under one root; click a node to zoom into its subtree."""
    roots = nodes["parent"] == ""
    labels = [
        f"{node_label(first, last)}<br>{hits:,} hits"
        for first, last, hits in zip(
            nodes["first_position"], nodes["block_position"], nodes["hits"], strict=True
        )
    ]
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
            customdata=[
                ["", "", "", 0],
                *zip(nodes["block_hash"], tenants, adapters, tokens, strict=True),
            ],
            hovertemplate=(
                "%{label}<br>block %{customdata[0]}<br>tenant %{customdata[1]}, "
                "adapter %{customdata[2]}<br>prefix of %{customdata[3]} tokens<extra></extra>"
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
