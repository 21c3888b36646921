"""Opening a run file: what it must be before a connection to it is handed out (DuckDB's own
format, undamaged, of the schema version this kvscope reads, not being written by another
process), the connection itself, and `StoreError`, raised when a run file cannot be used.
A run file is DuckDB's own format: a file of another kind is refused before DuckDB sees it,
and DuckDB never fetches or loads an extension for a run (it would go to the network)."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb

from collector.store.integrity import contents_problem, damage_met, layout_problem
from collector.store.leftovers import leftover
from collector.store.schema import CREATE_STATEMENTS, DERIVED_STATEMENTS, SCHEMA_VERSION
from collector.store.sql_literal import path_literal

DUCKDB_MAGIC = b"DUCK"  # bytes 8 to 11 of every DuckDB database file
ATTACHED_AS = "run"  # the name a run attached to an in-memory database has (`attached`)


class StoreError(RuntimeError):
    """A run file that cannot be used; the message says which file and why."""


class RunBeingWritten(StoreError):
    """The run file is open for writing in another process (`kvscope collect`)."""


# What DuckDB raises when a query meets damage that opening the run file could not see.
ReadError = duckdb.Error


# Every table a run file holds: those made at creation and those derived from the events.
RUN_TABLES = frozenset(
    re.findall(
        r"CREATE (?:OR REPLACE )?TABLE (\w+)", "\n".join((*CREATE_STATEMENTS, *DERIVED_STATEMENTS))
    )
)


def open_checked(
    path: Path, read_only: bool, own_database: bool = False
) -> duckdb.DuckDBPyConnection:
    """A connection to an existing, undamaged run file of the schema version this kvscope
    reads (read only and attached to an in-memory database of its own if `own_database`)."""
    if path.is_dir():
        runs = ", ".join(sorted(run.name for run in path.glob("*.duckdb"))) or "none"
        raise StoreError(f"{path}: a folder, not a run file (its .duckdb files: {runs})")
    if not path.is_file():
        raise StoreError(f"{path}: no such run file")
    temporary = leftover(path)
    if temporary is not None:
        raise StoreError(f"{path}: {temporary.describe()}")
    try:
        with path.open("rb") as handle:
            magic = handle.read(12)[8:]
    except OSError as error:
        raise StoreError(f"{path}: cannot be read: {error.strerror}") from error
    if magic != DUCKDB_MAGIC:
        raise StoreError(f"{path}: not a DuckDB file, so not a kvscope run")
    try:
        connection = attached(path) if own_database else connect(path, read_only=read_only)
    except duckdb.Error as error:
        reason = str(error).splitlines()[0]
        if isinstance(error, duckdb.IOException) and "lock" in reason.lower():
            raise RunBeingWritten(
                f"{path}: another process is writing this run (DuckDB allows one writer "
                f"and no reader meanwhile); read its live copy instead, "
                f"{live_copy_path(path)}, which `kvscope collect` publishes every "
                "--live-interval seconds once records arrive"
            ) from error
        if damage_met(error):
            damage = layout_problem(path) or reason  # a file cut short, said so
            raise StoreError(f"{path}: the run file is damaged: {damage}") from error
        raise StoreError(f"{path}: cannot open as a DuckDB run file: {reason}") from error
    try:
        problem = _problem(connection, path)
    except duckdb.Error as error:  # a block the checks read is damaged
        reason = str(error).splitlines()[0]
        damaged = damage_met(error)
        problem = f"{'the run file is damaged' if damaged else 'cannot be read'}: {reason}"
    if problem:
        connection.close()
        raise StoreError(f"{path}: {problem}")
    return connection


def _problem(connection: duckdb.DuckDBPyConnection, path: Path) -> str | None:
    """What makes an open DuckDB file no run this kvscope reads, if anything."""
    damage = layout_problem(path, connection)
    if damage:
        return f"the run file is damaged: {damage}"
    try:
        row = connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except duckdb.CatalogException:
        return "not a kvscope run (no meta table)"
    version = None if row is None else row[0]
    if version != str(SCHEMA_VERSION):
        return (
            f"run schema version {version}, this kvscope reads version {SCHEMA_VERSION}; "
            "replay the trace again or use the matching kvscope"
        )
    damage = contents_problem(connection, path, RUN_TABLES)
    return f"the run file is damaged: {damage}" if damage else None


def connect(path: Path, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    # Settings, not connect()'s config: DuckDB refuses a second connection to a file in one
    # process under another configuration, and the app and the tests open runs side by side.
    connection = duckdb.connect(str(path), read_only=read_only)
    connection.execute("SET autoinstall_known_extensions = false")
    connection.execute("SET autoload_known_extensions = false")
    return connection


def attached(path: Path) -> duckdb.DuckDBPyConnection:
    connection = connect(Path(":memory:"))
    try:
        connection.execute(f"ATTACH {path_literal(path)} AS {ATTACHED_AS} (READ_ONLY)")
        connection.execute(f"USE {ATTACHED_AS}")
    except duckdb.Error:
        connection.close()
        raise
    return connection


def live_copy_path(run_path: Path) -> Path:
    """Where `kvscope collect` publishes the readable copy of a run it is writing."""
    return run_path.with_name(run_path.name + ".live")


def live_copy_draft_path(run_path: Path) -> Path:
    """Where `kvscope collect` makes that copy before renaming it into place."""
    return run_path.with_name(f".{run_path.name}.live.tmp")
