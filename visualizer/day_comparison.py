"""The Overview's today against yesterday: the window's headline figures beside the same
length of the run just before it (for the whole run: its last 24 h against the 24 h
before), on a run longer than a day; a plain line saying why not on a shorter one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
import streamlit as st

from collector.model.run_calendar import RunCalendar
from collector.model.time_window import TimeWindow
from collector.queries.timeline import run_calendar
from collector.queries.window_comparison import ComparedFigures, compared_figures
from collector.store.run_file import RunFile


def render(run: RunFile, window: TimeWindow) -> None:
    calendar = run_calendar(run)
    hours = calendar.grid.span_s / 3600
    if not calendar.is_multi_day:
        st.caption(
            f"Today against yesterday: not shown, the run spans {hours:,.1f} h "
            "and the comparison needs more than a day."
        )
        return
    pair = calendar.before(window)
    if pair is None:
        st.caption(
            "Today against yesterday: not shown, the run does not reach back "
            f"{window.duration_s / 3600:,.1f} h before the range shown."
        )
        return
    current, before = pair
    st.subheader("Today against yesterday")
    st.caption(_heading(calendar, current, before))
    st.dataframe(
        comparison_table(compared_figures(run, current), compared_figures(run, before)),
        hide_index=True,
    )


def _heading(calendar: RunCalendar, current: TimeWindow, before: TimeWindow) -> str:
    return (
        f"{calendar.span_words(current.start_s, current.end_s)} ({current.duration_s / 3600:,.1f}"
        f" h) against {calendar.span_words(before.start_s, before.end_s)}, the same length "
        "before it."
    )


def comparison_table(today: ComparedFigures, yesterday: ComparedFigures) -> pd.DataFrame:
    """One row a figure: the window before, the window, and the change, as shown."""
    rows: list[tuple[str, str, Callable[[Any], str], Callable[[Any, Any], str]]] = [
        ("Hit ratio (tokens)", "token_hit_ratio", _share, _points),
        ("Prompt tokens", "prompt_tokens", _count, _relative),
        ("Evictions", "evictions", _count, _relative),
        ("Fewest free blocks (share of the pool)", "min_free_share", _share, _points),
    ]
    now, then = dict[str, Any](today), dict[str, Any](yesterday)
    table = [
        {
            "figure": label,
            "before": shown(then[key]),
            "now": shown(now[key]),
            "change": change(now[key], then[key]),
        }
        for label, key, shown, change in rows
    ]
    biggest = {
        name: f"{figures['biggest_cause']} ({figures['biggest_cause_share']:.1%})"
        if figures["biggest_cause"]
        else "none missed"
        for name, figures in (("before", yesterday), ("now", today))
    }
    same = today["biggest_cause"] == yesterday["biggest_cause"]
    table.append(
        {"figure": "Biggest miss cause", **biggest, "change": "same" if same else "changed"}
    )
    return pd.DataFrame(table, columns=["figure", "before", "now", "change"])


def _share(value: float | None) -> str:
    return "no pool steps" if value is None else f"{value:.1%}"


def _count(value: int) -> str:
    return f"{value:,}"


def _points(now: float | None, before: float | None) -> str:
    if now is None or before is None:
        return ""
    return f"{(now - before) * 100:+.1f} points"


def _relative(now: int, before: int) -> str:
    if not before:
        return "" if not now else "new"
    return f"{now / before - 1:+.0%}"
