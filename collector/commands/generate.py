"""`kvscope generate`: a realistic sample request trace."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from collector.replay.workload import NoSampleTokenizer, WorkloadShape, generate, write_trace


def register(commands: Any) -> None:
    defaults = WorkloadShape()
    parser = commands.add_parser(
        "generate",
        help="write a realistic sample request trace",
        description=(
            "A seeded trace of three tenants' traffic: multi-turn chats on shared system "
            "prompts, RAG requests over Zipf-popular documents, and a burst of daily reports "
            "with a timestamp near the start. The prompts are English text tokenized by "
            "Mistral 7B's tokenizer, which vLLM's requirement mistral_common ships "
            "(replay with --tokenizer mistral_common:data/tokenizer.model.v1 and "
            "--record-token-ids to see them as text in the app). The defaults reproduce the "
            "committed sample (sample_data/trace.jsonl.gz) byte for byte; another --seed "
            "gives another trace of the same shape."
        ),
    )
    parser.add_argument("--out", type=Path, required=True, help="trace to write (.jsonl[.gz])")
    parser.add_argument(
        "--seed",
        type=int,
        default=defaults.seed,
        help=f"random seed ({defaults.seed}: the committed sample's)",
    )
    parser.add_argument(
        "--duration-s",
        type=float,
        default=defaults.duration_s,
        help=f"seconds over which the requests arrive ({defaults.duration_s:g})",
    )
    for flag, what in (
        ("--chats", "multi-turn chats, each several requests"),
        ("--rag-requests", "RAG requests over the shared documents"),
        ("--reports", "daily-report requests, sent in one burst"),
    ):
        dest = "num_" + flag.removeprefix("--").replace("-", "_")
        default = getattr(defaults, dest)
        parser.add_argument(flag, type=int, default=default, dest=dest, help=f"{what} ({default})")
    parser.set_defaults(handler=_run_generate)


def _run_generate(args: argparse.Namespace) -> int:
    shape = WorkloadShape(
        seed=args.seed,
        duration_s=args.duration_s,
        num_chats=args.num_chats,
        num_rag_requests=args.num_rag_requests,
        num_reports=args.num_reports,
    )
    try:
        rows = generate(shape)
    except NoSampleTokenizer as error:
        print(f"kvscope: error: {error}", file=sys.stderr)
        return 2
    write_trace(rows, args.out)
    sample = " (the committed sample's trace)" if shape == WorkloadShape() else ""
    print(f"wrote {len(rows)} requests to {args.out}{sample}")
    return 0
