"""`kvscope replay`: a trace through vLLM's real KV cache manager into a run file."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tqdm import tqdm

from collector.commands.advise import advise_finished_run
from collector.commands.output import print_summary
from collector.commands.replay_options import add_replay_options, replay_options
from collector.replay.block_manager import require_vllm
from collector.replay.replayer import load_requests, replay_requests
from engine_hooks.privacy import load_secret


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "replay", help="replay a trace through vLLM's real KV cache manager into a run file"
    )
    parser.add_argument("trace", type=Path, help="Mooncake or kvscope request-trace JSONL")
    parser.add_argument("--out", type=Path, required=True, help="run file to create (.duckdb)")
    add_replay_options(parser)
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument(
        "--no-advise",
        action="store_true",
        help="do not work out the advice at the end (by default it is, and kept in the run "
        "file, so `kvscope advise`, the Advisor page and the scorecard read it at once)",
    )
    parser.set_defaults(handler=_run_replay)


def _run_replay(args: argparse.Namespace) -> int:
    require_vllm()  # before any work: a clear refusal, not a traceback in a worker
    options = replay_options(args)
    requests = load_requests(args.trace, options)  # read once: the bar's total, the replay
    disable = True if args.quiet else None  # None: tqdm draws only on a terminal
    with tqdm(total=len(requests), unit="req", disable=disable, desc="starting vLLM") as bar:
        summary = replay_requests(
            requests, args.trace, args.out, options, load_secret(), progress=timed(bar)
        )
    advised = None if args.no_advise else advise_finished_run(args.out, quiet=args.quiet)
    print_summary(summary, args.json)
    if not args.json:
        if advised is not None:
            suggestions, kept = advised
            print(f"\n{suggestions} suggestion(s); {kept} (`kvscope advise {args.out}`)")
        print(f"\nwrote {args.out}; open it with `kvscope app --db {args.out}`")
    return 0


def timed(bar: Any) -> Any:
    """The bar's update, which restarts its clock at the first request replayed: the rate
    and the time left then leave out vLLM's start (seconds, with no request done). `kvscope
    whatif`'s bar too."""
    started = False

    def update(count: int) -> None:
        nonlocal started
        if not started:
            started = True
            bar.reset(total=bar.total)
            bar.set_description("replaying")
        bar.update(count)

    return update
