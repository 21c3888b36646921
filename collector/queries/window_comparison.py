"""A window against the one before it (today against yesterday): the Overview's headline
figures, each counted by the query that counts it for one window."""

from __future__ import annotations

from typing import TypedDict

from collector.model.time_window import TimeWindow
from collector.queries.activity import window_figures
from collector.queries.miss_causes import CAUSE_NAMES, cause_totals
from collector.queries.pool import free_block_extremes
from collector.store.run_file import RunFile

SERVED = ("hit", "tier")


class ComparedFigures(TypedDict):
    """One window's headline figures; `biggest_cause` is "" when no prompt token missed."""

    token_hit_ratio: float
    prompt_tokens: int
    evictions: int
    min_free_share: float | None  # None: no pool steps in the window
    biggest_cause: str
    biggest_cause_share: float


def compared_figures(run: RunFile, window: TimeWindow) -> ComparedFigures:
    """The figures one column of the comparison shows for `window`."""
    figures = window_figures(run, window)
    pool = free_block_extremes(run, window=window)
    totals = cause_totals(run, window)
    lost = totals[~totals["cause"].isin(SERVED) & (totals["tokens"] > 0)]
    lost = lost.sort_values("tokens", ascending=False, kind="stable")
    return {
        "token_hit_ratio": figures["token_hit_ratio"],
        "prompt_tokens": figures["prompt_tokens"],
        "evictions": figures["evictions"],
        "min_free_share": (
            pool["min_free_blocks"] / pool["usable_blocks"] if pool["usable_blocks"] else None
        ),
        "biggest_cause": CAUSE_NAMES[str(lost["cause"].iloc[0])] if not lost.empty else "",
        "biggest_cause_share": float(lost["share"].iloc[0]) if not lost.empty else 0.0,
    }
