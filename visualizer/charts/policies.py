"""The Cache policies page's chart: each policy's token hit ratio against the pool size."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from collector.charts.theme import BLACK, BLUE, COLORS, GREEN, ORANGE, RATIO_AXIS, styled

# Row key (collector/model/policy_curves.py) -> legend name, colour, dash, marker. The ceiling
# is drawn dashed: no real policy reaches it.
POLICY_LINES = {
    "lru": ("LRU (vLLM)", BLUE, "solid", "circle"),
    "pin": ("LRU + pinning", ORANGE, "solid", "diamond"),
    "admit": ("LRU + admission", GREEN, "solid", "square"),
    "min": ("Belady's MIN (ceiling)", BLACK, "dash", "circle"),
}
LRU_WIDTH = 5  # under the others: where pinning or admission changes nothing, LRU still shows


def policy_curves_figure(rows: Sequence[dict[str, Any]], run_num_blocks: int) -> go.Figure:
    """One line per policy over the pool sizes of `PolicyCurves.rows` (log scale: the sizes
    double), LRU drawn first and wider, the run's own pool marked."""
    figure = go.Figure()
    sizes = [row["num_blocks"] for row in rows]
    for key, (name, color, dash, symbol) in POLICY_LINES.items():
        figure.add_scatter(
            x=sizes,
            y=[row[key] for row in rows],
            name=name,
            mode="lines+markers",
            line={"color": color, "dash": dash, "width": LRU_WIDTH if key == "lru" else 2},
            marker={"color": color, "symbol": symbol, "size": 10 if key == "lru" else 7},
            hovertemplate="%{y:.1%}",
        )
    # A shape's own label, not an annotation: an annotation's x is log10 on a log axis.
    figure.add_vline(
        x=run_num_blocks,
        line={"dash": "dot", "color": COLORS["alarm"]},
        label={"text": f"this run: {run_num_blocks:,} blocks", "textposition": "end"},
    )
    return styled(
        figure,
        title="Cache policies: token hit ratio against pool size",
        xaxis={
            "title": "pool size (blocks, log scale)",
            "type": "log",
            "tickvals": sizes,
            "ticktext": [f"{size:,}" for size in sizes],
        },
        yaxis=RATIO_AXIS | {"title": "token hit ratio"},
    )
