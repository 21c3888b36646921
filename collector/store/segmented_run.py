"""A segmented run's reading side: a run file (the head: the settings and the open segment's
rows) whose `meta` names closed segments, immutable Parquet files written by segments.py,
is read as one run (docs/run-files.md, Segmented runs).

`open_run` opens a run file as `open_checked` does; when the file is a head, it attaches it
to an in-memory DuckDB and makes each record table a view of the head's rows and the
Parquet files of the segments the head's `meta` keeps (FIRST_KEY up to NEXT_KEY, so files
of a segment being closed or dropped are never read half), `runs` and `meta` views of the
head's, and derives `requests` and the rollups from all of them, as a combined Parquet
dataset does; but for the cache lifetimes (and the hits' stores `tenant_sharing` counts),
made of those the kept segments derived when they closed and the head's, derived on from
them (segment_lifetimes.py), where every kept segment has them. A segment's manifest that
is gone was dropped by retention after the head (or its live copy) was read: its rows are
left out; a file its manifest lists and that is gone or of other bytes is refused."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb

from collector.store.lifetime_rollups import WHOLE_CACHE_LIFETIMES
from collector.store.parquet_dataset import DERIVED_TABLES
from collector.store.run_opening import (
    ATTACHED_AS,
    RUN_TABLES,
    StoreError,
    connect,
    open_checked,
)
from collector.store.schema import CREATE_STATEMENTS, DERIVED_STATEMENTS
from collector.store.segment_lifetimes import (
    CARRIED,
    ENDED,
    HITS,
    derive_segment,
    merged_hit_stores,
    merged_lifetimes,
)
from collector.store.sql_literal import path_literal

# The tables of recorded rows: those a segment takes out of the head.
RECORD_TABLES = tuple(sorted(RUN_TABLES - DERIVED_TABLES - {"runs", "meta"}))
DIR_KEY, FIRST_KEY, NEXT_KEY = "segments_dir", "segments_first", "segments_next"
RETENTION_KEY = "retention"
# The time (ts_ns) of the run's first record, kept when retention first drops it: the run's
# `started_at` is that record's wall time, whichever later record is the first kept.
ORIGIN_KEY = "first_record_ns"
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
    files, read = _segment_files(Path(meta[DIR_KEY]), str(run[0] if run else ""), segments)
    # The kept segments' lifetimes derived when each closed, if every one has them.
    derived = read > 0 and len(files.get(CARRIED, [])) == read
    return _whole_run(path, files, segments if derived else None), path, True


def _segment_files(
    directory: Path, run_id: str, segments: range
) -> tuple[dict[str, list[str]], int]:
    """The kept segments' files, by table, each checked against its manifest's bytes; and
    how many kept segments' manifests were read."""
    files: dict[str, list[str]] = {}
    read = 0
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
        read += 1
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
    return files, read


def _whole_run(
    path: Path, files: dict[str, list[str]], kept: range | None
) -> duckdb.DuckDBPyConnection:
    """An in-memory database `run` over the head attached as HEAD and the segments' files;
    its derived tables derived from every row, but for the cache lifetimes where the kept
    segments (`kept`) have theirs (segment_lifetimes.py)."""
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
            if statement != WHOLE_CACHE_LIFETIMES or kept is None:
                connection.execute(statement)
            else:
                _merge_lifetimes(connection, files, kept)
    except duckdb.Error as error:
        connection.close()
        reason = str(error).splitlines()[0]
        raise StoreError(f"{path}: a segmented run that cannot be read: {reason}") from error
    return connection


def _merge_lifetimes(
    connection: duckdb.DuckDBPyConnection, files: dict[str, list[str]], kept: range
) -> None:
    """The cache lifetimes and the hits' stores of the `kept` segments' files and of the
    head's rows (the open segment, numbered `kept.stop`), derived on from the last kept
    segment's state; from every row where the head's rows do not follow on from it."""

    def execute(sql: str) -> tuple[object, ...] | None:
        return connection.execute(sql).fetchone()

    head = f"{HEAD}.main.events"
    if not derive_segment(execute, head, kept.stop, files[CARRIED][-1], kept.start):
        connection.execute(WHOLE_CACHE_LIFETIMES)
        return
    connection.execute(merged_lifetimes(files.get(ENDED, []), kept.start))
    connection.execute(merged_hit_stores(files.get(HITS, []), kept.start))


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
