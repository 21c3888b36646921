"""A run as a hive-partitioned Parquet dataset, the form in which a fleet's runs are combined
and shared: `export_parquet` writes every table of a run file under a folder, and
`dataset_connection` reads one or several such folders back as one run.

Layout: `DIR/<table>/engine=<engine id>/date=<day>/<run id>_<n>.parquet` for the tables with
an engine column (`engine_id`), `DIR/<table>/<run id>.parquet` for the others, and
DATASET_MARKER, which makes a folder a dataset. `date` is the UTC day the run started: record
times are the engine's monotonic clock, which carries no date. The partition columns are not
in the files, and the views a dataset is read through leave them out: queries see the run
file's own columns, cast to the types of the schema this kvscope reads.

Files are named by their run, so several exports copied into one folder make one dataset.
Several runs read together make one run of several engines, as if one collector had
recorded them all: their rows side by side, the tables derived from the events (requests,
rollups) derived again from all of them, one `runs` row (the earliest run's settings, the
run ids joined by "+"). Runs combine only when their caches agree (block size, number of
blocks, hash) and no engine appears in two of them: an engine's block ids and record numbers
mean something only within its own run."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

import duckdb

from collector.store.run_file import RUN_TABLES, RunFile, StoreError
from collector.store.schema import CREATE_STATEMENTS, DERIVED_STATEMENTS, SCHEMA_VERSION
from collector.store.sql_literal import path_literal

DATASET_MARKER = "kvscope_dataset.json"
DATASET_FORMAT = 1
PARTITION_COLUMNS = ("engine", "date")
UNNAMED_ENGINE = "unnamed"  # the directory of records with no engine id (replays)
DERIVED_TABLES = frozenset(
    re.findall(r"CREATE OR REPLACE TABLE (\w+)", "\n".join(DERIVED_STATEMENTS))
)
# What one `runs` row says for several runs: the earliest run's value unless named here.
_COMBINED_RUN_COLUMNS = {
    "run_id": "string_agg(run_id, '+' ORDER BY run_id)",
    "started_at": "min(started_at)",
    "finished_at": "CASE WHEN count(finished_at) = count(*) THEN max(finished_at) END",
    "vllm_prefix_cache_queries": "sum(vllm_prefix_cache_queries)",
    "vllm_prefix_cache_hits": "sum(vllm_prefix_cache_hits)",
}


def is_dataset(path: Path) -> bool:
    """Whether `path` is a folder `export_parquet` wrote (or several copied into one)."""
    return (path / DATASET_MARKER).is_file()


def export_parquet(run: RunFile, directory: Path) -> None:
    """Write every table of `run` under `directory`, which must not exist or be empty; a
    failure leaves nothing there."""
    if directory.is_file() or (directory.is_dir() and any(directory.iterdir())):
        raise StoreError(f"{directory}: already exists; kvscope does not overwrite datasets")
    directory.parent.mkdir(parents=True, exist_ok=True)
    temporary = directory.with_name(f".{directory.name}.exporting-{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    try:
        tables = _write_tables(run, temporary)
        marker = {"format": DATASET_FORMAT, "schema_version": SCHEMA_VERSION, "tables": tables}
        (temporary / DATASET_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if directory.is_dir():
            directory.rmdir()
        os.replace(temporary, directory)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise


def _write_tables(run: RunFile, directory: Path) -> dict[str, list[str]]:
    """Copy each table of the run into its folder; its partition columns, by table."""
    row = run.row("SELECT run_id, CAST(started_at AS DATE) FROM runs")
    if row is None:
        raise StoreError(f"{run.path}: no row in its runs table")
    file_stem = re.sub(r"[^\w-]", "_", str(row[0]))
    tables: dict[str, list[str]] = {}
    for table in sorted(RUN_TABLES):
        columns = {name for name, *_ in run.rows(f"DESCRIBE {table}")}
        target = directory / table
        if "engine_id" in columns:
            run.row(
                f"COPY (SELECT *, coalesce(nullif(engine_id, ''), '{UNNAMED_ENGINE}') AS engine, "
                f"DATE '{row[1]}' AS date FROM {table}) TO {path_literal(target)} "
                f"(FORMAT PARQUET, PARTITION_BY (engine, date), "
                f"FILENAME_PATTERN '{file_stem}_{{i}}')"
            )
            tables[table] = list(PARTITION_COLUMNS)
        else:
            target.mkdir()
            run.row(
                f"COPY {table} TO {path_literal(target / f'{file_stem}.parquet')} (FORMAT PARQUET)"
            )
            tables[table] = []
    return tables


def open_dataset(directories: Sequence[Path]) -> RunFile:
    """One or several datasets (or one folder several were copied into) read as one run."""
    return RunFile(dataset_connection(directories), directories[0])


def dataset_connection(directories: Sequence[Path]) -> duckdb.DuckDBPyConnection:
    """An in-memory connection with one view per run table over the datasets' files."""
    for directory in directories:
        _check_marker(directory)
    connection = duckdb.connect()
    connection.execute("SET autoinstall_known_extensions = false")
    connection.execute("SET autoload_known_extensions = false")
    for statement in (*CREATE_STATEMENTS, *DERIVED_STATEMENTS):
        connection.execute(statement)  # the tables empty, for their columns and types
    files = {table: _files(connection, directories, table) for table in RUN_TABLES}
    combined = len(files["runs"]) > 1
    for table in sorted(RUN_TABLES - DERIVED_TABLES if combined else RUN_TABLES):
        if files[table]:
            _replace_with_view(connection, table, files[table], combined)
    if combined:
        _check_combinable(connection, directories, files)
        for statement in DERIVED_STATEMENTS:
            connection.execute(statement)
    return connection


def _check_marker(directory: Path) -> None:
    try:
        marker = json.loads((directory / DATASET_MARKER).read_text())
        version, schema_version = marker["format"], marker["schema_version"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise StoreError(f"{directory}: not a kvscope Parquet dataset: {error}") from error
    if version != DATASET_FORMAT or schema_version != SCHEMA_VERSION:
        raise StoreError(
            f"{directory}: a dataset of format {version}, run schema version {schema_version}; "
            f"this kvscope reads format {DATASET_FORMAT}, version {SCHEMA_VERSION}: export "
            "the run again with the matching kvscope"
        )


def _files(
    connection: duckdb.DuckDBPyConnection, directories: Sequence[Path], table: str
) -> list[str]:
    """The table's Parquet files in every dataset (none for a table with no rows)."""
    patterns = [str(directory / table / "**" / "*.parquet") for directory in directories]
    return [
        file
        for pattern in patterns
        for (file,) in connection.execute(
            "SELECT file FROM glob(?) ORDER BY file", [pattern]
        ).fetchall()
    ]


def _replace_with_view(
    connection: duckdb.DuckDBPyConnection, table: str, files: list[str], combined: bool
) -> None:
    """The empty table becomes a view of the same columns over its files."""
    columns = connection.execute(
        "SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = ? "
        "ORDER BY column_index",
        [table],
    ).fetchall()
    source = (
        f"read_parquet([{', '.join(path_literal(file) for file in files)}], "
        "hive_partitioning = false, union_by_name = true)"
    )
    if table == "runs" and combined:
        expressions = [
            _COMBINED_RUN_COLUMNS.get(name, f"arg_min({name}, started_at)") for name, _ in columns
        ]
    else:
        expressions = [f'"{name}"' for name, _ in columns]
    select = ", ".join(
        f'CAST({expression} AS {data_type}) AS "{name}"'
        for expression, (name, data_type) in zip(expressions, columns, strict=True)
    )
    # Rows every run holds alike (its schema version, a block's tokens) are kept once.
    distinct = "DISTINCT " if combined and table in ("meta", "block_tokens") else ""
    body = f"SELECT {distinct}{select} FROM {source}"
    connection.execute(f"DROP TABLE {table}")
    connection.execute(f"CREATE VIEW {table} AS {body}")


def _check_combinable(
    connection: duckdb.DuckDBPyConnection, directories: Sequence[Path], files: dict[str, list[str]]
) -> None:
    """Refuse runs whose caches differ, or that share an engine."""
    names = ", ".join(str(directory) for directory in directories)
    runs = ", ".join(path_literal(file) for file in files["runs"])
    settings = connection.execute(
        f"SELECT run_id, block_size, num_blocks, hash_algo FROM read_parquet([{runs}]) "
        "ORDER BY run_id"
    ).fetchall()
    if len({tuple(row[1:]) for row in settings}) > 1:
        described = "; ".join(
            f"{run_id}: block size {size}, {blocks} blocks, {algo}"
            for run_id, size, blocks, algo in settings
        )
        raise StoreError(f"{names}: runs with different caches do not combine ({described})")
    engine_files = [file for table in ("events", "pool", "collisions") for file in files[table]]
    shared = connection.execute(
        "SELECT regexp_extract(file, 'engine=([^/]*)/', 1) AS engine FROM unnest(?) AS f(file) "
        "GROUP BY engine HAVING count(DISTINCT regexp_extract(file, '([^/]*)_\\d+\\.parquet$', 1))"
        " > 1 ORDER BY engine",
        [engine_files],
    ).fetchall()
    if shared:
        engines = ", ".join(engine for (engine,) in shared)
        raise StoreError(
            f"{names}: engines recorded in more than one run do not combine ({engines}): an "
            "engine's block ids and record numbers hold within its run only"
        )
