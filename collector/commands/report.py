"""`kvscope report`: a candidate run against a baseline, for CI. Exit 0 pass, 1 regression,
2 bad input."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collector.commands.replay_options import add_replay_options, replay_options
from collector.report.figures import read_run
from collector.report.formatting import format_limit, format_value
from collector.report.inputs import ReportInput, check_inputs, prepare_runs
from collector.report.thresholds import load_thresholds
from collector.report.verdict import compare
from engine_hooks.privacy import load_secret

if TYPE_CHECKING:
    from collector.report.verdict import Comparison

EXIT_REGRESSION = 1


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "report",
        help="compare a candidate run with a baseline: Markdown, HTML, JUnit and JSON; "
        "exit 1 when a check regressed",
        description="Inputs ending in .duckdb are run files, and folders `kvscope export` "
        "wrote are runs as Parquet datasets; any other input is a trace, "
        "replayed first with the replay options below into OUT_DIR/baseline.duckdb and "
        "OUT_DIR/candidate.duckdb.",
    )
    parser.add_argument("--baseline", type=Path, required=True, help="run file, dataset or trace")
    parser.add_argument("--candidate", type=Path, required=True, help="run file, dataset or trace")
    parser.add_argument(
        "--thresholds", type=Path, help="TOML file of limits (docs/ci/thresholds.toml)"
    )
    parser.add_argument(
        "--out-dir", type=Path, default=Path("kvscope-report"), help="where the report goes"
    )
    add_replay_options(parser)
    parser.set_defaults(handler=_run_report)


def _run_report(args: argparse.Namespace) -> int:
    from collector.report.outputs import write_report  # noqa: PLC0415 - the HTML report loads plotly; `kvscope --help` loads none of it

    thresholds = load_thresholds(args.thresholds)
    options = replay_options(args)
    inputs = [ReportInput("baseline", args.baseline), ReportInput("candidate", args.candidate)]
    check_inputs(inputs, args.out_dir)
    if not all(report_input.is_run for report_input in inputs):
        print(f"replaying traces into {args.out_dir} ...", file=sys.stderr)
    runs = prepare_runs(inputs, args.out_dir, options, load_secret())
    within_s = thresholds.eviction_regret.within_s or None
    baseline, baseline_series = read_run(runs["baseline"], within_s)
    candidate, candidate_series = read_run(runs["candidate"], within_s)
    source = "defaults" if args.thresholds is None else str(args.thresholds)
    comparison = compare(baseline, candidate, thresholds, source)
    paths = write_report(args.out_dir, comparison, baseline_series, candidate_series)
    _print_checks(comparison)
    print("wrote " + ", ".join(str(path) for path in paths))
    return EXIT_REGRESSION if comparison.regressed else 0


def _print_checks(comparison: Comparison) -> None:
    """One line per check, the miss cause that grew most (information), then the verdict."""
    width = max(len(check.name) for check in comparison.checks)
    for check in comparison.checks:
        if check.status == "skip":
            print(f"skip  {check.name:<{width}}  {check.reason}")
            continue
        values = (
            f"{format_value(check.baseline, check.unit)} -> "
            f"{format_value(check.candidate, check.unit)}"
        )
        print(
            f"{check.status.upper():<4}  {check.name:<{width}}  {values}  ({format_limit(check)})"
        )
    print(comparison.miss_line)
    if comparison.regressed:
        names = ", ".join(check.name for check in comparison.regressed)
        print(f"regression: {names}")
    else:
        print("pass: no check regressed")
