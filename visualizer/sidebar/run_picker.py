"""The sidebar's run picker: a folder, and any `.duckdb` run in it."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from visualizer import session
from visualizer.run_source import RUN_PATH_KEY, current_run, problem_with, runs_in_folder
from visualizer.sidebar.time_filter import DAYS_KEY, RANGE_KEY

FOLDER_KEY = "run_folder"
PICKER_KEY = "run_picker"


def _picked() -> None:
    """A run was picked: show it, over its whole time range."""
    st.session_state[RUN_PATH_KEY] = st.session_state[PICKER_KEY]
    session.forget(RANGE_KEY)
    session.forget(DAYS_KEY)


def render() -> None:
    """The folder input and the run select box (the run shown is session_state["run_path"])."""
    current = current_run()
    session.show(FOLDER_KEY, session.kept(FOLDER_KEY) or str(current.parent))
    folder = Path(
        st.sidebar.text_input("Runs folder", key=FOLDER_KEY, on_change=session.keeper(FOLDER_KEY))
    ).expanduser()
    choices = [str(path) for path in runs_in_folder(folder)]
    if not choices:
        st.sidebar.warning(f"No .duckdb runs in {folder}")
    if str(current) not in choices:
        choices.insert(0, str(current))
    # The run shown is the source of truth; the select box follows it.
    st.session_state[PICKER_KEY] = str(current)
    st.sidebar.selectbox(
        "Run",
        choices,
        format_func=lambda path: _named(Path(path), folder),
        key=PICKER_KEY,
        on_change=_picked,
    )


def _named(path: Path, folder: Path) -> str:
    """A run by its name in the folder (its path elsewhere), flagged when it is not a run."""
    name = path.name if path.parent == folder else str(path)
    problem = problem_with(path) if path.exists() else None  # a run file, or a dataset
    return f"{name} (not a run: {problem})" if problem else name
