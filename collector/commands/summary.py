"""`kvscope summary`: the headline figures of a run file."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from collector.commands.output import print_summary
from collector.health.scorecard import scorecard
from collector.health.thresholds import load_thresholds
from collector.queries.latency import latency_figures, latency_sentence, request_latency
from collector.queries.summary import run_summary
from collector.safe_text import shown
from collector.store.run_file import RunStore


def register(commands: Any) -> None:
    parser = commands.add_parser("summary", help="print the headline figures of a run file")
    parser.add_argument("run", type=Path, help="run file (.duckdb) or Parquet dataset")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument(
        "--health",
        action="store_true",
        help="add the health scorecard (docs/health.md; thresholds from the file "
        "KVSCOPE_HEALTH_THRESHOLDS names, else the defaults)",
    )
    parser.set_defaults(handler=_run_summary)


def _run_summary(args: argparse.Namespace) -> int:
    thresholds = load_thresholds() if args.health else None  # bad input before any work
    store = RunStore.open(args.run)
    try:
        summary: dict[str, Any] = dict(run_summary(store))
        latency = request_latency(store)
        lines = scorecard(store, thresholds) if thresholds is not None else []
    finally:
        store.close()
    if args.json and thresholds is not None:
        summary["health"] = [dataclasses.asdict(line) for line in lines]
    if args.json:
        summary["latency"] = latency_figures(latency)
    print_summary(summary, args.json)
    if not args.json and not latency.empty:
        print(f"\nlatency by hit share: {latency_sentence(latency)}")
    if lines and not args.json:
        print("\nhealth (the whole run; docs/health.md):")
        for line in lines:  # the run's own words (tenant names) escaped for the terminal
            print(f"  {line.status:<5}  {line.name}: {shown(line.sentence, None)} [{line.page}]")
    return 0
