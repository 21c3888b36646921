"""The KV cache groups' blocks over time: what each group of a hybrid model held of the pool."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from collector.charts.theme import CATEGORY_COLORS, COLORS, styled


def group_in_use_figure(
    timeline: pd.DataFrame, group_names: list[str], num_usable_blocks: int
) -> go.Figure:
    """Blocks in use by each group over time, stacked (their sum is the pool's in-use line),
    under the usable pool's size."""
    figure = go.Figure()
    for group, name in enumerate(group_names):
        rows = timeline[timeline["kv_group"] == group]
        figure.add_scatter(
            x=rows["t_s"],
            y=rows["in_use"],
            name=f"group {group}: {name}",
            stackgroup="groups",
            mode="lines",
            line={"width": 0.5, "color": CATEGORY_COLORS[group % len(CATEGORY_COLORS)]},
        )
    figure.add_hline(
        y=num_usable_blocks,
        line={"dash": "dash", "color": COLORS["alarm"]},
        annotation_text="the pool",
        annotation_position="top left",
    )
    return styled(
        figure,
        title="Blocks in use by each KV cache group",
        xaxis_title="time (s)",
        yaxis={"title": "blocks", "range": [0, num_usable_blocks * 1.08]},
    )
