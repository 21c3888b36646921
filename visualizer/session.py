"""Widget values that live on across pages and runs.

Streamlit keeps a widget's state only while the same widget (the same id) is drawn on every
run. The sidebar is drawn by each page, so its widgets get another id on every page. So each
value is kept under a plain session key: set into the widget before it is drawn, and copied
back by the widget's on_change callback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st

_KEPT = "_kept_"


def kept(key: str) -> Any:
    """The value kept for widget `key` (None before there is one)."""
    return st.session_state.get(_KEPT + key)


def show(key: str, value: Any) -> None:
    """Keep `value` and give it to widget `key` (call before drawing the widget)."""
    st.session_state[_KEPT + key] = value
    st.session_state[key] = value


def keeper(key: str) -> Callable[[], None]:
    """The on_change callback that keeps what the user set in widget `key`."""

    def keep() -> None:
        st.session_state[_KEPT + key] = st.session_state[key]

    return keep


def forget(key: str) -> None:
    """Drop a widget's kept value (it starts from its default next time)."""
    st.session_state.pop(_KEPT + key, None)
    st.session_state.pop(key, None)
