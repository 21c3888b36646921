"""kvscope's app: `streamlit run visualizer/app.py [-- --db RUN.duckdb]`, or `kvscope app`.

Its settings (127.0.0.1 only, no usage statistics) are in `visualizer/.streamlit/config.toml`,
beside this script, where Streamlit reads them whatever the working folder.
"""

from __future__ import annotations

import streamlit as st

from collector.store.run_file import ReadError, StoreError
from visualizer.page_selection import navigation as pages_for_the_run
from visualizer.run_source import current_run
from visualizer.sidebar import live_refresh


def main() -> None:
    st.set_page_config(page_title="kvscope", layout="wide")
    navigation = st.navigation(pages_for_the_run())
    with st.sidebar:
        live_refresh.follow(current_run())
    try:
        navigation.run()
    except (ReadError, StoreError) as error:  # damaged where opening the run did not look
        st.error(f"Cannot read this run: {str(error).splitlines()[0]}")


main()
