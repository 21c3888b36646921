"""`kvscope summary`: the headline figures of a run file."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from collector.commands.output import print_summary
from collector.queries.summary import run_summary
from collector.store.run_file import RunStore


def register(commands: Any) -> None:
    parser = commands.add_parser("summary", help="print the headline figures of a run file")
    parser.add_argument("run", type=Path, help="run file (.duckdb) or Parquet dataset")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.set_defaults(handler=_run_summary)


def _run_summary(args: argparse.Namespace) -> int:
    store = RunStore.open(args.run)
    try:
        summary = run_summary(store)
    finally:
        store.close()
    print_summary(summary, args.json)
    return 0
