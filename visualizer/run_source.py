"""Which run the app shows, and that run file open for reading."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import streamlit as st

from collector.store.parquet_dataset import is_dataset
from collector.store.run_file import (
    RunFile,
    StoreError,
    live_copy_path,
    open_readable,
    run_file_problem,
)

SAMPLE_RUN = Path(__file__).resolve().parents[1] / "sample_data" / "run.duckdb"
RUN_PATH_KEY = "run_path"


def run_from_arguments(argv: list[str] | None = None) -> Path:
    """The run (or folder of runs) named by `-- --db RUN.duckdb`, else $KVSCOPE_DB, else the
    committed sample."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--db", type=Path)
    known, _ = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if known.db is not None:
        return Path(known.db)
    from_environment = os.environ.get("KVSCOPE_DB")
    return Path(from_environment) if from_environment else SAMPLE_RUN


def current_run() -> Path:
    """The run chosen in this session (the run picker), else the one from the command line;
    for a folder, the first run in it (the run picker then offers the others)."""
    if RUN_PATH_KEY not in st.session_state:
        st.session_state[RUN_PATH_KEY] = str(run_from_arguments())
    path = Path(st.session_state[RUN_PATH_KEY])
    runs = runs_in_folder(path)
    if runs:
        path = runs[0]
        st.session_state[RUN_PATH_KEY] = str(path)
    return path


@st.cache_resource(max_entries=4)
def _opened(path: str, versions: tuple[int, int]) -> tuple[RunFile, bool]:
    del versions  # part of the cache key: a new version of the file is opened afresh
    return open_readable(Path(path))


def _version(path: Path) -> int:
    return path.stat().st_mtime_ns if path.exists() else 0


def run_versions(path: Path) -> tuple[int, int]:
    """The run file's and its live copy's modification times: a cache key that changes when
    either is written."""
    return (_version(path), _version(live_copy_path(path)))


def not_written_yet(path: Path) -> bool:
    """Neither the run file nor its live copy exists: a collector waiting for its first
    batch creates the file when that arrives."""
    return not path.exists() and not live_copy_path(path).exists()


def open_run(path: Path) -> RunFile:
    """A run file open for reading, or its live copy while it is being written."""
    return _open(path)[0]


def _open(path: Path) -> tuple[RunFile, bool]:
    """The run (opened once per version of the file and of its live copy, read through a
    cursor of this page run's own), and whether it is the live copy."""
    run, live = _opened(str(path), run_versions(path))
    return run.cursor(), live


def runs_in_folder(folder: Path) -> list[Path]:
    """The `.duckdb` files and Parquet datasets in a folder, by name (none if it is not a
    folder, or is a dataset itself)."""
    if not folder.is_dir() or is_dataset(folder):
        return []
    files = (path for path in folder.glob("*.duckdb") if path.is_file())
    datasets = (path for path in folder.iterdir() if path.is_dir() and is_dataset(path))
    return sorted([*files, *datasets])


def problem_with(path: Path) -> str | None:
    """Why a `.duckdb` file is not a kvscope run this app shows, or None (run_file.py)."""
    return _problem(str(path), _version(path))


@st.cache_data(max_entries=256, show_spinner=False)
def _problem(path: str, version: int) -> str | None:
    del version  # part of the cache key: a rewritten file is checked afresh
    return run_file_problem(Path(path))


def open_current_run() -> RunFile:
    """The chosen run, open for reading; if it cannot be opened, says why and stops the page."""
    path = current_run()
    if not_written_yet(path):
        st.info(
            f"Waiting for the collector's first batch: {path} does not exist yet. "
            f"`kvscope collect --db {path}` creates it when an engine's first records "
            "arrive, and this page then shows it by itself. (If no collector writes there, "
            "check the path.)"
        )
        st.stop()
    try:
        run, live = _open(path)
    except (StoreError, OSError) as error:
        st.error(f"Cannot show this run. {error}")
        st.stop()
    if not live and not run.finished:
        st.warning(
            f"{path.name} was not finished: its collector stopped without finalizing it "
            "(killed?), so the figures built at the end (requests, rollups) may be missing "
            f"or behind its events. `kvscope finish {path}` finishes it; "
            f"`kvscope collect --db {path}` goes on recording into it."
        )
    return run
