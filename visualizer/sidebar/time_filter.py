"""The time-range filter every page shares: whole buckets of the run's rollup grid."""

from __future__ import annotations

import streamlit as st

from collector.model.time_window import TimeWindow
from collector.queries.timeline import time_grid
from collector.store.run_file import RunFile
from visualizer import session

RANGE_KEY = "time_range"
_SPAN_KEY = "time_range_span"  # the run's span when the range was last drawn


def render(run: RunFile) -> None:
    """The sidebar slider (seconds from the run's first record). A range that reached the
    run's end follows it as a live run grows."""
    grid = time_grid(run)
    span = grid.span_s
    chosen = session.kept(RANGE_KEY)
    if chosen and chosen[1] == st.session_state.get(_SPAN_KEY):
        chosen = (chosen[0], span)
    if not chosen or not 0 <= chosen[0] <= chosen[1] <= span:
        chosen = (0.0, span)
    session.show(RANGE_KEY, tuple(chosen))
    st.session_state[_SPAN_KEY] = span
    st.sidebar.slider(
        "Time range (s)",
        min_value=0.0,
        max_value=span,
        step=grid.bucket_s,
        format="%.1f" if grid.bucket_s >= 0.1 else "%.4f",
        key=RANGE_KEY,
        on_change=session.keeper(RANGE_KEY),
        help=f"Every page counts only what happened in this range ({grid.bucket_s:g} s steps).",
    )


def selected_window(run: RunFile) -> TimeWindow:
    """The window the slider selects (the whole run before it is drawn)."""
    grid = time_grid(run)
    chosen = session.kept(RANGE_KEY)
    return grid.window(*chosen) if chosen else grid.whole_run()


def window_caption(window: TimeWindow, run: RunFile) -> str:
    """Which part of the run a page shows, in words."""
    span = time_grid(run).span_s

    def seconds(value: float) -> str:
        return f"{value:,.1f}" if span >= 10 else f"{value:.3g}"

    if window.is_whole_run:
        return f"the whole run ({seconds(span)} s)"
    return f"{seconds(window.start_s)}-{seconds(window.end_s)} s of {seconds(span)} s"
