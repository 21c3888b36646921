"""`kvscope export`: a run written as a hive-partitioned Parquet dataset, which every
command and the app open as a run, and Spark, Trino or ClickHouse read as tables
(`collector/store/parquet_dataset.py`, docs/run-files.md, "Runs as Parquet datasets")."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from collector.store.parquet_export import export_parquet
from collector.store.run_file import RunFile


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "export", help="write a run as a Parquet dataset (partitioned by engine and date)"
    )
    parser.add_argument("run", type=Path, help="run file (.duckdb) or Parquet dataset")
    parser.add_argument(
        "--parquet",
        type=Path,
        required=True,
        metavar="DIR",
        help="folder to write the dataset into (must not exist, or be empty)",
    )
    parser.set_defaults(handler=_run_export)


def _run_export(args: argparse.Namespace) -> int:

    with RunFile.open(args.run) as run:
        export_parquet(run, args.parquet)
    print(f"{args.parquet}: the run {args.run} as a Parquet dataset")
    return 0
