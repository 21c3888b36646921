"""`kvscope prompt-trace`: a prompt set rendered from prompt templates into a request trace."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from collector.replay.prompt_set import render_prompt_set
from collector.replay.workload import write_trace


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "prompt-trace",
        help="render a prompt set (JSONL over prompt templates) into a request trace",
        description="Each line of PROMPT_SET names templates and their variables; see "
        "collector/replay/prompt_set.py and docs/ci/README.md.",
    )
    parser.add_argument("prompt_set", type=Path, help="prompt set (JSONL)")
    parser.add_argument(
        "--templates", type=Path, required=True, help="directory the template names are under"
    )
    parser.add_argument("--out", type=Path, required=True, help="trace to write (.jsonl[.gz])")
    parser.set_defaults(handler=_run_prompt_trace)


def _run_prompt_trace(args: argparse.Namespace) -> int:
    rows = render_prompt_set(args.prompt_set, args.templates)
    write_trace(rows, args.out)
    tokens = sum(len(row["token_ids"]) for row in rows)
    print(f"wrote {len(rows)} requests ({tokens:,} prompt tokens) to {args.out}")
    return 0
