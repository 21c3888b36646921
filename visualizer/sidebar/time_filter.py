"""The time-range filter every page shares: whole buckets of the run's rollup grid. A run
longer than a day also gets a day picker (the last 24 h, the 24 h before, each calendar day)
and its range in wall-clock dates and times."""

from __future__ import annotations

import streamlit as st

from collector.model.run_calendar import DAY_BEFORE, LAST_DAY, RunCalendar
from collector.model.time_window import TimeWindow
from collector.queries.timeline import run_calendar, time_grid
from collector.store.run_file import RunFile
from visualizer import session

RANGE_KEY = "time_range"
_SPAN_KEY = "time_range_span"  # the run's span when the range was last drawn
DAYS_KEY = "time_range_days"
OWN_RANGE = "a range of your own"


def render(run: RunFile) -> None:
    """The sidebar slider (seconds from the run's first record). A range that reached the
    run's end follows it as a live run grows. A run longer than a day gets a day picker
    above it and the range in wall times under it."""
    calendar = run_calendar(run)
    grid = calendar.grid
    span = grid.span_s
    chosen = session.kept(RANGE_KEY)
    if chosen and chosen[1] == st.session_state.get(_SPAN_KEY):
        chosen = (chosen[0], span)
    if calendar.is_multi_day and session.kept(DAYS_KEY) in (LAST_DAY, DAY_BEFORE):
        chosen = calendar.ranges().get(session.kept(DAYS_KEY), chosen)  # moves as a run grows
    if not chosen or not 0 <= chosen[0] <= chosen[1] <= span:
        chosen = (0.0, span)
    session.show(RANGE_KEY, tuple(chosen))
    st.session_state[_SPAN_KEY] = span
    if calendar.is_multi_day:
        _day_picker(calendar, tuple(chosen))
    st.sidebar.slider(
        "Time range (s)",
        min_value=0.0,
        max_value=span,
        step=grid.bucket_s,
        format="%.1f" if grid.bucket_s >= 0.1 else "%.4f",
        key=RANGE_KEY,
        on_change=_moved,
        help=f"Every page counts only what happened in this range ({grid.bucket_s:g} s steps).",
    )
    if calendar.is_multi_day:
        start, end = session.kept(RANGE_KEY)
        st.sidebar.caption(calendar.span_words(start, end))


def _moved() -> None:
    """The slider was moved by hand: its range is kept, and no day is picked any more."""
    session.keeper(RANGE_KEY)()
    session.forget(DAYS_KEY)


def _day_picker(calendar: RunCalendar, chosen: tuple[float, float]) -> None:
    """Whole days of a long run; picking one sets the range the slider then shows (the last
    24 h and the 24 h before keep moving with a live run's end)."""
    ranges = calendar.ranges()
    picked = next((label for label, span in ranges.items() if span == chosen), OWN_RANGE)
    st.session_state[DAYS_KEY] = picked

    def pick() -> None:
        label = st.session_state[DAYS_KEY]
        session.keeper(DAYS_KEY)()
        if label in ranges:
            session.show(RANGE_KEY, ranges[label])

    st.sidebar.selectbox(
        "Days",
        [*ranges, OWN_RANGE],
        key=DAYS_KEY,
        on_change=pick,
        help="Whole days of the run (UTC, from its start time), or the slider's range.",
    )


def selected_window(run: RunFile) -> TimeWindow:
    """The window the slider selects (the whole run before it is drawn)."""
    grid = time_grid(run)
    chosen = session.kept(RANGE_KEY)
    return grid.window(*chosen) if chosen else grid.whole_run()


def window_caption(window: TimeWindow, run: RunFile) -> str:
    """Which part of the run a page shows, in words (in wall times too for a run longer
    than a day)."""
    calendar = run_calendar(run)
    span = calendar.grid.span_s

    def seconds(value: float) -> str:
        return f"{value:,.1f}" if span >= 10 else f"{value:.3g}"

    if window.is_whole_run:
        shown = f"the whole run ({seconds(span)} s)"
    else:
        shown = f"{seconds(window.start_s)}-{seconds(window.end_s)} s of {seconds(span)} s"
    if calendar.is_multi_day:
        shown += f": {calendar.span_words(window.start_s, window.end_s)}"
    return shown
