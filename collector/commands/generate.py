"""`kvscope generate`: a realistic sample request trace."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(commands: Any) -> None:
    parser = commands.add_parser("generate", help="write a realistic sample request trace")
    parser.add_argument("--out", type=Path, required=True, help="trace to write (.jsonl[.gz])")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--duration-s", type=float, default=120.0)
    parser.add_argument("--chats", type=int, default=60, dest="num_chats")
    parser.add_argument("--rag-requests", type=int, default=200, dest="num_rag_requests")
    parser.add_argument("--reports", type=int, default=60, dest="num_reports")
    parser.set_defaults(handler=_run_generate)


def _run_generate(args: argparse.Namespace) -> int:
    from collector.replay.workload import WorkloadShape, generate, write_trace

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
