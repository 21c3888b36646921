"""Why prompts missed: the window's prompt tokens as a waterfall (hit, then each cause of a
miss), the prefix families that lost the most tokens and to what, and one request's prompt
as a strip of its blocks, each coloured by what became of it."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from collector.charts.theme import (
    BLUE,
    BROWN,
    CYAN,
    GREEN,
    GREY,
    LIGHT_BLUE,
    LIGHT_BROWN,
    LIGHT_GREY,
    OLIVE,
    ORANGE,
    PINK,
    PURPLE,
    RED,
    styled,
)
from collector.queries.miss_causes import CAUSE_NAMES, CAUSES

CAUSE_COLORS = {
    "hit": GREEN,
    "tier": LIGHT_BLUE,
    "group_cut": CYAN,
    "cold": BLUE,
    "diverged": ORANGE,
    "key_mismatch": PURPLE,
    "evicted": RED,
    "preempted": PINK,
    "cleared": BROWN,
    "engine_stopped": LIGHT_BROWN,
    "other_engine": OLIVE,
    "partial_block": LIGHT_GREY,
    "unexplained": GREY,
}
TOTAL_NAME = "prompt tokens looked up"
BAR_HEIGHT = 34


def percent(share: float) -> str:
    """A share as a percentage, one decimal; under 0.05 % but not nothing, "<0.1%"."""
    return "<0.1%" if 0 < share < 0.0005 else f"{share:.1%}"


def shown_causes(totals: pd.DataFrame) -> pd.DataFrame:
    """The causes of `cause_totals` with tokens, in CAUSES' order, each with its `name`."""
    shown = totals[totals["tokens"] > 0]
    return shown.assign(name=[CAUSE_NAMES[cause] for cause in shown["cause"]])


def waterfall_figure(totals: pd.DataFrame) -> go.Figure:
    """The prompt tokens of `cause_totals` (collector/queries/miss_causes.py) as a waterfall:
    the hits, then one step per cause with tokens, each starting where the one above ended
    and coloured as the cause is on every chart, then the prompt tokens looked up; each
    step in tokens and share."""
    shown = shown_causes(totals)
    looked_up = int(totals["tokens"].sum())
    tokens = shown["tokens"].astype(int).tolist()
    starts = [sum(tokens[:index]) for index in range(len(tokens))]
    shares = shown["share"].tolist()
    texts = [f"{count:,} ({percent(share)})" for count, share in zip(tokens, shares, strict=True)]
    figure = go.Figure(
        go.Bar(
            orientation="h",
            y=[*shown["name"], TOTAL_NAME],
            x=[*tokens, looked_up],
            base=[*starts, 0],
            marker_color=[*(CAUSE_COLORS[cause] for cause in shown["cause"]), GREY],
            text=[*texts, f"{looked_up:,} (100 %)"],
            textposition="outside",
            cliponaxis=False,
            hovertemplate="%{y}: %{x:,} tokens<extra></extra>",
        )
    )
    return styled(
        figure,
        title="Where the prompt tokens went",
        xaxis={"title": "prompt tokens", "range": [0, looked_up * 1.3 if looked_up else 1]},
        yaxis={"autorange": "reversed"},
        height=130 + BAR_HEIGHT * (len(shown) + 1),
        showlegend=False,
        hovermode="closest",
    )


def family_losses_figure(losses: pd.DataFrame) -> go.Figure:
    """The families of `family_losses` (with a `label` column naming each), the tokens their
    lookups missed stacked by cause (coloured as on the waterfall), the family that lost
    most on top."""
    order = list(dict.fromkeys(losses["label"]))
    figure = go.Figure()
    for cause in CAUSES:
        rows = losses[losses["cause"] == cause]
        if rows.empty:
            continue
        figure.add_bar(
            y=rows["label"],
            x=rows["tokens"],
            name=CAUSE_NAMES[cause],
            orientation="h",
            marker_color=CAUSE_COLORS[cause],
            customdata=rows[["requests", "family_hex"]].to_numpy(),
            hovertemplate="%{y}<br>"
            + CAUSE_NAMES[cause]
            + ": %{x:,} tokens, %{customdata[0]:,} requests<br>first block %{customdata[1]}"
            "<extra></extra>",
        )
    return styled(
        figure,
        title="The prefix families that lost the most tokens",
        barmode="stack",
        xaxis_title="prompt tokens missed",
        yaxis={"categoryorder": "array", "categoryarray": order, "autorange": "reversed"},
        height=130 + BAR_HEIGHT * len(order),
        margin={"l": 20, "r": 20, "t": 60, "b": 40},
        showlegend=False,  # each cause is coloured as on the waterfall, which names them
        hovermode="closest",
    )


def block_strip_figure(segments: pd.DataFrame) -> go.Figure:
    """One request's lookups (rows, `lookup`) across its prompt: each `segment` (`start`,
    `tokens`) coloured by its `cause`, with its `detail` on hover."""
    figure = go.Figure()
    for cause in CAUSES:
        rows = segments[segments["cause"] == cause]
        if rows.empty:
            continue
        figure.add_bar(
            y=rows["lookup"],
            x=rows["tokens"],
            base=rows["start"],
            name=CAUSE_NAMES[cause],
            orientation="h",
            marker={"color": CAUSE_COLORS[cause], "line": {"color": "white", "width": 1}},
            customdata=rows[["where", "detail"]].to_numpy(),
            hovertemplate="%{customdata[0]}: "
            + CAUSE_NAMES[cause]
            + ", %{x:,} tokens<br>%{customdata[1]}<extra></extra>",
        )
    lookups = list(dict.fromkeys(segments["lookup"]))
    return styled(
        figure,
        title="The prompt, block by block: hit, or missed and why",
        barmode="overlay",
        xaxis_title="prompt tokens",
        yaxis={"categoryorder": "array", "categoryarray": lookups, "autorange": "reversed"},
        height=220 + 50 * len(lookups),
        legend={"orientation": "h", "yanchor": "top", "y": -0.3, "x": 0},
        hovermode="closest",
    )
