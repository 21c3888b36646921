"""kvscope's app: `streamlit run visualizer/app.py [-- --db RUN.duckdb]`."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

PAGES = Path(__file__).parent / "pages"


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
        st.Page(PAGES / "compare.py", title="Compare runs"),
    ]
    st.navigation(pages).run()


main()
