"""A run file exported as a Parquet dataset (parquet_dataset.py says its layout, and reads it
back): `export_parquet` writes every table of a run under a folder."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from collector.store.dataset_manifest import write_manifest
from collector.store.leftovers import remove_leftovers
from collector.store.parquet_dataset import DATASET_FORMAT, DATASET_MARKER
from collector.store.run_file import RunFile
from collector.store.run_opening import RUN_TABLES, StoreError
from collector.store.schema import SCHEMA_VERSION
from collector.store.sql_literal import path_literal

PARTITION_COLUMNS = ("engine", "date")
UNNAMED_ENGINE = "unnamed"  # the directory of records with no engine id (replays)


def export_parquet(run: RunFile, directory: Path) -> None:
    """Write every table of `run` under `directory`, which must not exist or be empty; a
    failure leaves nothing there."""
    if directory.is_file() or (directory.is_dir() and any(directory.iterdir())):
        raise StoreError(f"{directory}: already exists; kvscope does not overwrite datasets")
    directory.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(directory.parent)  # of exports killed there
    temporary = directory.with_name(f".{directory.name}.exporting-{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    try:
        tables = _write_tables(run, temporary)
        write_manifest(temporary, tables, _file_stem(run))
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
    row = run.row("SELECT CAST(started_at AS DATE) FROM runs")
    if row is None:
        raise StoreError(f"{run.path}: no row in its runs table")
    file_stem = _file_stem(run)
    tables: dict[str, list[str]] = {}
    for table in sorted(RUN_TABLES):
        columns = {name for name, *_ in run.rows(f"DESCRIBE {table}")}
        target = directory / table
        if "engine_id" in columns:
            run.row(
                f"COPY (SELECT *, coalesce(nullif(engine_id, ''), '{UNNAMED_ENGINE}') AS engine, "
                f"DATE '{row[0]}' AS date FROM {table}) TO {path_literal(target)} "
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


def _file_stem(run: RunFile) -> str:
    """What the files of a run's export are named by: its id, as a file name."""
    row = run.row("SELECT run_id FROM runs")
    return re.sub(r"[^\w-]", "_", str(row[0] if row else ""))
