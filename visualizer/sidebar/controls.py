"""The sidebar every page draws first: the run picker and the time-range filter.

Each page draws it first and gets the chosen run and time window back. The widgets' values
live on across pages and runs (visualizer/session.py).
"""

from __future__ import annotations

import streamlit as st

from collector.model.time_window import TimeWindow
from collector.store.run_file import RunFile
from visualizer.run_source import open_current_run
from visualizer.sidebar import run_picker, time_filter

PAGE_TITLE = "kvscope"


def render() -> tuple[RunFile, TimeWindow]:
    """Draw the sidebar; return the chosen run and time window."""
    st.set_page_config(page_title=PAGE_TITLE, layout="wide")
    run_picker.render()
    run = open_current_run()
    time_filter.render(run)
    return run, time_filter.selected_window(run)
