"""The options every benchmark that replays the Mooncake synthetic trace takes."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "shared/traces/mooncake/synthetic_trace.jsonl"


def add_replay_arguments(parser: argparse.ArgumentParser, limit: int | None = None) -> None:
    """--trace, --block-size, --num-blocks and --limit (the first N requests; all by default
    unless `limit` says otherwise)."""
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-blocks", type=int, default=20_000)
    parser.add_argument("--limit", type=int, default=limit, help="first N requests only")
