"""`kvscope finish`: finalize a run whose collector was killed before it could."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from collector.queries.summary import run_summary
from collector.store.run_file import RunStore


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "finish",
        help="finalize a run whose collector stopped without finishing it (derived tables, "
        "finish time); `kvscope collect --db RUN` resumes one instead",
    )
    parser.add_argument("run", type=Path, help="run file (.duckdb)")
    parser.set_defaults(handler=_run_finish)


def _run_finish(args: argparse.Namespace) -> int:
    store = RunStore.resume(args.run)
    try:
        store.finalize()
        summary = run_summary(store)
    finally:
        store.close()
    print(
        f"kvscope finish: {args.run} finished: {summary['requests']:,} requests, "
        f"{summary['events']:,} records stored, {summary['dropped_events']:,} missing"
    )
    return 0
