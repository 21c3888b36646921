"""The `kvscope` command line. Exit codes: 0 done, 2 bad input (file, line and reason on stderr)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EXIT_BAD_INPUT = 2


def _replay_parser(commands: Any) -> None:
    from collector.block_manager import HASH_ALGOS
    from collector.replay import TIMINGS
    from collector.traces import FORMATS

    parser = commands.add_parser(
        "replay", help="replay a trace through vLLM's real KV cache manager into a run file"
    )
    parser.add_argument("trace", type=Path, help="Mooncake or kvscope request-trace JSONL")
    parser.add_argument("--out", type=Path, required=True, help="run file to create (.duckdb)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per block (16)")
    parser.add_argument(
        "--num-blocks", type=int, default=20_000, help="blocks in the pool, null block included"
    )
    parser.add_argument("--hash-algo", choices=HASH_ALGOS, default="sha256")
    parser.add_argument("--timing", choices=TIMINGS, default="sequential")
    parser.add_argument(
        "--max-num-seqs", type=int, default=256, help="running requests at most (timestamps)"
    )
    parser.add_argument("--step-ms", type=float, default=10.0, help="step time (timestamps)")
    parser.add_argument(
        "--prefill-us-per-token",
        type=float,
        default=25.0,
        help="step time added per computed prompt token (timestamps)",
    )
    parser.add_argument("--format", choices=FORMATS, default="auto", dest="trace_format")
    parser.add_argument("--limit", type=int, help="replay only the first N requests")
    parser.add_argument(
        "--record-token-ids", action="store_true", help="store prompt token ids (private!)"
    )
    parser.add_argument(
        "--reveal-tenants", action="store_true", help="store tenant names, not pseudonyms"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(handler=_run_replay)


def _run_replay(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from collector.block_manager import CacheSettings
    from collector.replay import ReplayOptions, load_requests, replay
    from collector.simulator import StepModel
    from engine_hooks.privacy import load_secret

    options = ReplayOptions(
        settings=CacheSettings(args.block_size, args.num_blocks, args.hash_algo),
        timing=args.timing,
        max_num_seqs=args.max_num_seqs,
        step_model=StepModel(args.step_ms, args.prefill_us_per_token),
        trace_format=args.trace_format,
        limit=args.limit,
        record_token_ids=args.record_token_ids,
        reveal_tenants=args.reveal_tenants,
    )
    total = len(load_requests(args.trace, options))
    with tqdm(total=total, unit="req", disable=True if args.quiet else None) as bar:
        summary = replay(args.trace, args.out, options, load_secret(), progress=bar.update)
    _print_summary(summary, args.json)
    return 0


def _summary_parser(commands: Any) -> None:
    parser = commands.add_parser("summary", help="print the headline figures of a run file")
    parser.add_argument("run", type=Path, help="run file (.duckdb)")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.set_defaults(handler=_run_summary)


def _run_summary(args: argparse.Namespace) -> int:
    from collector.store import RunStore
    from collector.summary import run_summary

    store = RunStore.open(args.run)
    try:
        summary = run_summary(store.connection)
    finally:
        store.close()
    _print_summary(summary, args.json)
    return 0


def _print_summary(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, sort_keys=True))
        return
    width = max(len(name) for name in summary)
    for name, value in summary.items():
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        print(f"{name:<{width}}  {shown}")


def _generate_parser(commands: Any) -> None:
    parser = commands.add_parser("generate", help="write a realistic sample request trace")
    parser.add_argument("--out", type=Path, required=True, help="trace to write (.jsonl[.gz])")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--duration-s", type=float, default=120.0)
    parser.add_argument("--chats", type=int, default=60, dest="num_chats")
    parser.add_argument("--rag-requests", type=int, default=200, dest="num_rag_requests")
    parser.add_argument("--reports", type=int, default=60, dest="num_reports")
    parser.set_defaults(handler=_run_generate)


def _run_generate(args: argparse.Namespace) -> int:
    from collector.workload import WorkloadShape, generate, write_trace

    shape = WorkloadShape(
        seed=args.seed,
        duration_s=args.duration_s,
        num_chats=args.num_chats,
        num_rag_requests=args.num_rag_requests,
        num_reports=args.num_reports,
    )
    rows = generate(shape)
    write_trace(rows, args.out)
    print(f"wrote {len(rows)} requests to {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvscope", description="See and tune vLLM's automatic prefix caching."
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    for add in (_replay_parser, _summary_parser, _generate_parser):
        add(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from collector.store import StoreError
    from collector.traces import TraceError

    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except (TraceError, StoreError, ValueError) as error:
        print(f"kvscope: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
