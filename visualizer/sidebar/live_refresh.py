"""Following a run that `kvscope collect` is still writing."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from collector.store.run_file import live_copy_path
from visualizer.run_source import not_written_yet

REFRESH_S = 3.0
_SEEN_KEY = "live_copy_version"
_WAITING_KEY = "live_waiting_for_run"


@st.fragment(run_every=REFRESH_S)
def follow(path: Path) -> None:
    """While the run has a live copy, rerun the whole app whenever a newer copy appears;
    while neither the run nor its copy exists (a collector waiting for its first batch),
    rerun it as soon as one does."""
    if not_written_yet(path):
        st.session_state[_WAITING_KEY] = True
        return
    if st.session_state.pop(_WAITING_KEY, False):
        st.rerun(scope="app")
    copy = live_copy_path(path)
    if not copy.is_file():
        st.session_state.pop(_SEEN_KEY, None)
        return
    version = copy.stat().st_mtime_ns
    seen = st.session_state.get(_SEEN_KEY)
    st.session_state[_SEEN_KEY] = version
    st.caption(f"live: following {path.name} as it is written (every {REFRESH_S:g} s)")
    if seen is not None and seen != version:
        st.rerun(scope="app")
