"""kvscope's app: `streamlit run visualizer/app.py [-- --db RUN.duckdb]`."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import streamlit as st

from visualizer import live_refresh
from visualizer.run_source import current_run

PAGES = Path(__file__).parent / "views"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def served_privately() -> bool:
    """Whether Streamlit listens on the loopback network only and sends no usage statistics
    (or the user asked for another address with KVSCOPE_APP_ALLOW_REMOTE=1)."""
    address = st.get_option("server.address")
    local = address in LOOPBACK or os.environ.get("KVSCOPE_APP_ALLOW_REMOTE") == "1"
    return local and not st.get_option("browser.gatherUsageStats")


def main() -> None:
    st.set_page_config(page_title="kvscope", layout="wide")
    if not served_privately():
        st.error(
            "kvscope shows nothing here: this Streamlit server listens on every network "
            "interface or sends usage statistics (started outside kvscope's folder, it does not "
            "read kvscope's .streamlit/config.toml). Start the app with `kvscope app "
            "[--db RUN]`, from any folder. To serve other machines on purpose, set "
            "KVSCOPE_APP_ALLOW_REMOTE=1 and pass --server.address yourself."
        )
        st.stop()
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
