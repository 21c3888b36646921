"""kvscope's app: `streamlit run visualizer/app.py [-- --db RUN.duckdb]`, or `kvscope app`.

Its settings (127.0.0.1 only, no usage statistics) are in `visualizer/.streamlit/config.toml`,
beside this script, where Streamlit reads them whatever the working folder.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import streamlit as st

from visualizer import live_refresh
from visualizer.run_source import current_run

PAGES = Path(__file__).parent / "views"


def main() -> None:
    st.set_page_config(page_title="kvscope", layout="wide")
    pages = [
        st.Page(PAGES / "overview.py", title="Overview", default=True),
        st.Page(PAGES / "hotspots.py", title="Hotspots"),
        st.Page(PAGES / "prefix_tree.py", title="Prefix tree"),
        st.Page(PAGES / "roi.py", title="ROI"),
        st.Page(PAGES / "free_blocks.py", title="Free blocks"),
        st.Page(PAGES / "collisions.py", title="Collisions"),
        st.Page(PAGES / "tenants.py", title="Tenants & adapters"),
        st.Page(PAGES / "advisor.py", title="Advisor"),
        st.Page(PAGES / "compare.py", title="Compare runs"),
        st.Page(PAGES / "vllm_kv_events.py", title="vLLM KV events"),
    ]
    navigation = st.navigation(pages)
    with st.sidebar:
        live_refresh.follow(current_run())
    try:
        navigation.run()
    except duckdb.Error as error:  # damaged where opening the run could not tell
        st.error(f"Cannot read this run: {str(error).splitlines()[0]}")


main()
