"""The sidebar every page draws first: the run picker and the time-range filter.

Each page draws it first and gets the chosen run and time window back. The widgets' values
live on across pages and runs (visualizer/session.py).

(The page files live in `visualizer/views/`, not `pages/`: Streamlit treats a `pages/` folder
beside the entry file as an old-style multipage app and would bypass `st.navigation`.)
"""

from __future__ import annotations

import duckdb
import streamlit as st

from collector.time_window import TimeWindow
from visualizer import run_picker, time_filter
from visualizer.run_source import open_current_run

PAGE_TITLE = "kvscope"


def render() -> tuple[duckdb.DuckDBPyConnection, TimeWindow]:
    """Draw the sidebar; return the chosen run and time window."""
    st.set_page_config(page_title=PAGE_TITLE, layout="wide")
    run_picker.render()
    connection = open_current_run()
    time_filter.render(connection)
    return connection, time_filter.selected_window(connection)
