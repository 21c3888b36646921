"""Which run the app shows, and a read-only connection to it."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import duckdb
import streamlit as st

from collector.store import StoreError, live_copy_path, open_readable, run_is_finished

SAMPLE_RUN = Path(__file__).resolve().parents[1] / "sample_data" / "run.duckdb"
RUN_PATH_KEY = "run_path"


def run_from_arguments(argv: list[str] | None = None) -> Path:
    """The run named by `-- --db RUN.duckdb`, else $KVSCOPE_DB, else the committed sample."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--db", type=Path)
    known, _ = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if known.db is not None:
        return Path(known.db)
    from_environment = os.environ.get("KVSCOPE_DB")
    return Path(from_environment) if from_environment else SAMPLE_RUN


def current_run() -> Path:
    """The run chosen in this session (the run picker), else the one from the command line."""
    if RUN_PATH_KEY not in st.session_state:
        st.session_state[RUN_PATH_KEY] = str(run_from_arguments())
    return Path(st.session_state[RUN_PATH_KEY])


@st.cache_resource(max_entries=4)
def _connection(path: str, versions: tuple[int, int]) -> tuple[duckdb.DuckDBPyConnection, bool]:
    del versions  # part of the cache key: a new version of the file gets a fresh connection
    store, live = open_readable(Path(path))
    return store.connection, live


def _version(path: Path) -> int:
    return path.stat().st_mtime_ns if path.exists() else 0


def connect(path: Path) -> duckdb.DuckDBPyConnection:
    """A read-only connection to a run file, or to its live copy while it is being written
    (opened once per version of either)."""
    versions = (_version(path), _version(live_copy_path(path)))
    return _connection(str(path), versions)[0].cursor()


def reading_live_copy(path: Path) -> bool:
    """Whether `connect(path)` reads the live copy of a run being written."""
    versions = (_version(path), _version(live_copy_path(path)))
    return _connection(str(path), versions)[1]


def runs_in_folder(folder: Path) -> list[Path]:
    """The `.duckdb` files in a folder, by name (none if it is not a folder)."""
    if not folder.is_dir():
        return []
    return sorted(path for path in folder.glob("*.duckdb") if path.is_file())


def open_current_run() -> duckdb.DuckDBPyConnection:
    """A connection to the chosen run; if it cannot be opened, says why and stops the page."""
    path = current_run()
    try:
        connection = connect(path)
    except (StoreError, OSError) as error:
        st.error(f"Cannot show this run. {error}")
        st.stop()
    if not reading_live_copy(path) and not run_is_finished(connection):
        st.warning(
            f"{path.name} was not finished: its collector stopped without finalizing it "
            "(killed?), so the figures built at the end (requests, rollups) may be missing "
            f"or behind its events. `kvscope finish {path}` finishes it; "
            f"`kvscope collect --db {path}` goes on recording into it."
        )
    return connection
