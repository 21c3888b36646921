"""A segmented run's reading side: a run file (the head: the settings and the open segment's
rows) whose `meta` names closed segments, immutable Parquet files written by segments.py,
is read as one run (docs/run-files.md, Segmented runs).

`open_run` opens a run file as `open_checked` does; when the file is a head, it attaches it
to an in-memory DuckDB and makes each record table a view of the head's rows and the
Parquet files of the segments the head's `meta` keeps (FIRST_KEY up to NEXT_KEY, so files
of a segment being closed or dropped are never read half), `runs` and `meta` views of the
head's, and derives `requests` and the rollups from all of them, as a combined Parquet
dataset does. A segment's manifest that is gone was dropped by retention after the head (or
its live copy) was read: its rows are left out; a file its manifest lists and that is gone
or of other bytes is refused."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb

from collector.store.parquet_dataset import DERIVED_TABLES
from collector.store.run_opening import (
    ATTACHED_AS,
    RUN_TABLES,
    StoreError,
    connect,
    open_checked,
)
from collector.store.schema import CREATE_STATEMENTS, DERIVED_STATEMENTS
from collector.store.sql_literal import path_literal

# The tables of recorded rows: those a segment takes out of the head.
RECORD_TABLES = tuple(sorted(RUN_TABLES - DERIVED_TABLES - {"runs", "meta"}))
DIR_KEY, FIRST_KEY, NEXT_KEY = "segments_dir", "segments_first", "segments_next"
RETENTION_KEY = "retention"
MANIFESTS = "manifests"
HEAD = "head"  # the name the head is attached under
CLOSED_EVENTS = "closed_events"  # a view of the closed segments' event rows alone


def segment_stem(run_id: str, number: int) -> str:
    """What the files and the manifest of a run's segment are named by."""
    return f"{run_id}-{number:06d}"


def open_run(
    path: Path, read_only: bool, own_database: bool = False
) -> tuple[duckdb.DuckDBPyConnection, Path, bool]:
    """A connection to the run file at `path` (open_checked), or, for a segmented run read
    only, to the whole run; with the path, and whether the run is an attached database."""
    connection = open_checked(path, read_only, own_database)
    if not read_only:
        return connection, path, own_database
    try:
        segmented = connection.execute("SELECT 1 FROM meta WHERE key = ?", [DIR_KEY]).fetchone()
        if segmented is None:
            return connection, path, own_database
        meta = dict(connection.execute("SELECT key, value FROM meta").fetchall())
        run = connection.execute("SELECT run_id FROM runs").fetchone()
    except duckdb.Error as error:
        connection.close()
        reason = str(error).splitlines()[0]
        raise StoreError(f"{path}: the run file is damaged: {reason}") from error
    connection.close()
    segments = range(int(meta[FIRST_KEY]), int(meta[NEXT_KEY]))
    files = _segment_files(Path(meta[DIR_KEY]), str(run[0] if run else ""), segments)
    return _whole_run(path, files), path, True


def _segment_files(directory: Path, run_id: str, segments: range) -> dict[str, list[str]]:
    """The kept segments' files, by table, each checked against its manifest's bytes."""
    files: dict[str, list[str]] = {}
    for number in segments:
        manifest_path = directory / MANIFESTS / f"{segment_stem(run_id, number)}.json"
        try:
            listed = json.loads(manifest_path.read_text())["files"]
        except FileNotFoundError:
            continue  # dropped by retention since the head was read
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise StoreError(
                f"{manifest_path}: a segment's manifest cannot be read: {error}"
            ) from error
        for name, entry in sorted(listed.items()):
            file = directory / name
            size = file.stat().st_size if file.is_file() else None
            if size != entry["bytes"]:
                found = "missing" if size is None else f"{size:,} bytes"
                raise StoreError(
                    f"{file}: {found} where {manifest_path.name} lists {entry['bytes']:,} bytes "
                    "(a closed segment's file, lost or damaged)"
                )
            files.setdefault(name.split("/")[0], []).append(str(file))
    return files


def _whole_run(path: Path, files: dict[str, list[str]]) -> duckdb.DuckDBPyConnection:
    """An in-memory database `run` over the head attached as HEAD and the segments' files."""
    connection = connect(Path(":memory:"))
    try:
        connection.execute(f"ATTACH {path_literal(path)} AS {HEAD} (READ_ONLY)")
        connection.execute(f"ATTACH ':memory:' AS {ATTACHED_AS}")
        connection.execute(f"USE {ATTACHED_AS}")
        for statement in (*CREATE_STATEMENTS, *DERIVED_STATEMENTS):
            connection.execute(statement)  # the tables empty, for their columns and types
        for table in ("meta", "runs", *RECORD_TABLES):
            _replace_with_view(connection, table, files.get(table, []))
        _replace_with_view(connection, "events", files.get("events", []), CLOSED_EVENTS)
        for statement in DERIVED_STATEMENTS:
            connection.execute(statement)
    except duckdb.Error as error:
        connection.close()
        reason = str(error).splitlines()[0]
        raise StoreError(f"{path}: a segmented run that cannot be read: {reason}") from error
    return connection


def _replace_with_view(
    connection: duckdb.DuckDBPyConnection, table: str, files: list[str], name: str = ""
) -> None:
    """The empty table becomes a view of the same columns over the head's rows and `files`;
    with `name`, a view of that name over `files` alone is made beside it."""
    columns = connection.execute(
        "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = ? "
        "AND table_name = ? ORDER BY column_index",
        [ATTACHED_AS, table],
    ).fetchall()
    select = ", ".join(f'CAST("{name}" AS {data_type}) AS "{name}"' for name, data_type in columns)
    sources = [] if name else [f"{HEAD}.main.{table}"]
    if files:
        names = ", ".join(path_literal(file) for file in files)
        sources.append(f"read_parquet([{names}], hive_partitioning = false, union_by_name = true)")
    body = " UNION ALL ".join(f"SELECT {select} FROM {source}" for source in sources)
    if not name:
        connection.execute(f"DROP TABLE {table}")
    connection.execute(
        f"CREATE VIEW {name or table} AS {body or f'SELECT {select} FROM {table} LIMIT 0'}"
    )
