"""A run as a hive-partitioned Parquet dataset, the form in which a fleet's runs are combined
and shared: `export_parquet` (parquet_export.py) writes every table of a run file under a
folder, and
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
import re
from collections.abc import Sequence
from pathlib import Path

import duckdb

from collector.store.dataset_manifest import check_dataset
from collector.store.integrity import CONTENTS_KEY, settings_problem
from collector.store.run_opening import RUN_TABLES, StoreError, connect
from collector.store.schema import CREATE_STATEMENTS, DERIVED_STATEMENTS, SCHEMA_VERSION
from collector.store.sql_literal import path_literal

DATASET_MARKER = "kvscope_dataset.json"
DATASET_FORMAT = 2  # 2: with manifests (dataset_manifest.py)
READ_FORMATS = (1, 2)
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


def dataset_connection(directories: Sequence[Path]) -> duckdb.DuckDBPyConnection:
    """An in-memory connection with one view per run table over the datasets' files."""
    for directory in directories:
        version = _check_marker(directory)
        problem = check_dataset(directory, RUN_TABLES, version)
        if problem:
            raise StoreError(f"{directory}: the dataset is damaged: {problem}")
    connection = connect(Path(":memory:"))
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
    problem = settings_problem(connection)
    if problem:
        connection.close()
        names = ", ".join(str(directory) for directory in directories)
        raise StoreError(f"{names}: the dataset is damaged: {problem}")
    return connection


def _check_marker(directory: Path) -> int:
    """The dataset's format, checked to be one this kvscope reads."""
    try:
        marker = json.loads((directory / DATASET_MARKER).read_text())
        version, schema_version = marker["format"], marker["schema_version"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise StoreError(
            f"{directory}: not a kvscope Parquet dataset: {DATASET_MARKER}: {error}"
        ) from error
    if version not in READ_FORMATS or schema_version != SCHEMA_VERSION:
        raise StoreError(
            f"{directory}: a dataset of format {version}, run schema version {schema_version}; "
            f"this kvscope reads formats {', '.join(map(str, READ_FORMATS))}, version "
            f"{SCHEMA_VERSION}: export "
            "the run again with the matching kvscope"
        )
    return int(version)


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
    if combined and table == "meta":  # each run's record of its own file's rows
        body += f" WHERE key <> '{CONTENTS_KEY}'"
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
