"""What kvscope's hooks cost vLLM's real Scheduler, and the first-token wrapper's share.

`hooks_paired.py` and `hooks_overhead.py` drive vLLM's KV cache manager alone, so they never
reach the scheduler's wrappers (engine_hooks/scheduler_hooks.py). Here the trace (the
sample's by default) is replayed through vLLM's own `Scheduler` as `--timing scheduler`
replays it (collector/replay/scheduler_replay.py: `schedule()` and `update_from_output()`
every step, at the trace's arrival times, on a virtual clock), in these configurations:
  bare                no hooks
  hooks               every hook kvscope attaches to a scheduler (`SchedulerHooks` over
                      `KVCacheHooks`, with the fingerprints on, the plugin's default): what
                      KVSCOPE_CAPTURE=1 costs the engine's thread, less the transport's
  hooks-no-first      as hooks, without what records the first tokens: the scheduler's
                      `update_from_output` is left unwrapped and no request is kept as
                      prefilling, so no `FirstToken` is recorded (the hooks as they were
                      before first tokens: the records printed differ by one a request)
Every configuration drains its records after each step, as the plugin's transport takes
them (`EventBuffer.take`), and sends them nowhere: no collector runs. Every run is a fresh
Python process, as in `hooks_overhead.py` (a run leaves a heap that slows the next), which
freezes its startup heap (`freeze_gc_heap`) as vLLM's EngineCore does; the rounds run the
configurations in turn, the order rotating from round to round, so the machine's drift hits
all alike. Reading the trace and building the scheduler are not timed.

Prints, per configuration: the median CPU seconds of the replay, the median over rounds of
its ratio to the same round's bare run, and the records drained; then the first-token
wrapper's share: the median per-round ratio hooks / hooks-no-first and its cost per step,
the difference of the two runs' CPU time over the steps (calls of `update_from_output`).

    python benchmarks/scheduler_hooks.py [--trace sample_data/trace.jsonl.gz] [--limit N]
        [--rounds 5] [--block-size 16] [--num-blocks 1200] [--max-num-seqs 32]
        [--max-num-batched-tokens 8192]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from capture_setup import make_hooks
from hooks_overhead import child_arguments, median
from replay_args import add_replay_arguments

from collector.model.step_model import StepModel
from collector.replay.block_manager import CacheSettings, make_block_hasher
from collector.replay.scheduler_replay import SchedulerLimits, SchedulerReplay, run_engines
from collector.replay.simulator import VirtualClock
from collector.replay.traces import read_trace
from engine_hooks import EventBuffer
from engine_hooks.scheduler_hooks import SchedulerHooks

CONFIGS = ("bare", "hooks", "hooks-no-first")
SAMPLE_TRACE = Path(__file__).resolve().parents[1] / "sample_data/trace.jsonl.gz"


class _NeverPrefilling(dict[str, list[Any]]):
    """A `SchedulerHooks._prefilling` that keeps no request: none awaits a first token."""

    def setdefault(self, key: str, default: Any = None) -> Any:
        return default


class HooksWithoutFirstTokens(SchedulerHooks):
    """kvscope's scheduler hooks less what records the first tokens: `update_from_output`
    unwrapped, and no request kept as prefilling (so `_free_request` records none either)."""

    WRAPPED = tuple(name for name in SchedulerHooks.WRAPPED if name != "update_from_output")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._prefilling = _NeverPrefilling()


def run_once(args: argparse.Namespace) -> dict[str, Any]:
    """One replay in this process (the child's side); returns what it measured."""
    from vllm.utils.gc_utils import freeze_gc_heap  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    requests = read_trace(args.trace)[: args.limit]
    settings = CacheSettings(args.block_size, args.num_blocks)
    clock = VirtualClock()
    buffer = EventBuffer()
    counts = {"steps": 0, "records": 0}

    def drain() -> None:
        counts["steps"] += 1
        counts["records"] += len(buffer.take())

    replay = SchedulerReplay(
        settings,
        SchedulerLimits(args.max_num_seqs, args.max_num_batched_tokens),
        step_model=StepModel(),
        block_hasher=make_block_hasher(settings),
        clock=clock,
        on_step=drain,
    )
    replay.start(requests)
    hooks = None
    if args.run != "bare":
        kind = SchedulerHooks if args.run == "hooks" else HooksWithoutFirstTokens
        tenants = {request.request_id: request.tenant for request in requests}
        manager_hooks = make_hooks(
            replay.scheduler.kv_cache_manager, buffer, clock, check_collisions=True
        )
        hooks = kind(
            replay.scheduler, manager_hooks, lambda request: tenants[request.request_id]
        ).attach()
    freeze_gc_heap()  # as vLLM's EngineCore does once it is built
    start = time.process_time()
    run_engines([replay], requests, lambda request, index: 0, lambda _: None)
    elapsed = time.process_time() - start
    gc.unfreeze()
    if hooks is not None:
        hooks.detach()
    return {"cpu_s": elapsed, "requests": len(requests), **counts}


def measure(config: str, args: argparse.Namespace) -> dict[str, Any]:
    """One run of `config` in a fresh process."""
    command = [
        sys.executable,
        __file__,
        *child_arguments(args),
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--max-num-batched-tokens",
        str(args.max_num_batched_tokens),
        "--run",
        config,
    ]
    child = subprocess.run(command, check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    return result


def run_rounds(args: argparse.Namespace) -> list[dict[str, dict[str, Any]]]:
    """Every configuration once a round, the order rotating; each round's results."""
    rounds = []
    for number in range(args.rounds):
        shift = number % len(CONFIGS)
        results = {}
        for config in CONFIGS[shift:] + CONFIGS[:shift]:
            results[config] = result = measure(config, args)
            print(
                f"  round {number + 1} {config:<15} {result['cpu_s']:7.2f} CPU s "
                f"{result['records']:>9,} records {result['steps']:>7,} steps",
                flush=True,
            )
        rounds.append(results)
    return rounds


def report(rounds: list[dict[str, dict[str, Any]]]) -> None:
    """Per configuration its median CPU seconds and ratio to bare; the wrapper's share."""
    print(f"\n{'config':<15} {'CPU s':>7} {'x bare':>7} {'records':>9}  per round")
    for config in CONFIGS:
        runs = [results[config] for results in rounds]
        ratios = [results[config]["cpu_s"] / results["bare"]["cpu_s"] for results in rounds]
        print(
            f"{config:<15} {median(runs, 'cpu_s'):7.2f} {statistics.median(ratios):7.3f} "
            f"{median(runs, 'records'):9,.0f}  {' '.join(f'{ratio:.3f}' for ratio in ratios)}"
        )
    steps = {results[config]["steps"] for results in rounds for config in CONFIGS}
    share = [results["hooks"]["cpu_s"] / results["hooks-no-first"]["cpu_s"] for results in rounds]
    per_step_us = [
        (results["hooks"]["cpu_s"] - results["hooks-no-first"]["cpu_s"])
        / results["hooks"]["steps"]
        * 1e6
        for results in rounds
    ]
    print(
        f"first-token wrapper: hooks / hooks-no-first {statistics.median(share):.3f}x "
        f"(per round {' '.join(f'{ratio:.3f}' for ratio in share)}); "
        f"{statistics.median(per_step_us):.2f} us a step "
        f"(per round {' '.join(f'{us:.2f}' for us in per_step_us)}; "
        f"steps per run: {', '.join(f'{count:,}' for count in sorted(steps))})"
    )
    print(
        "x bare: the median over rounds of each round's CPU time / that round's bare time; "
        "us a step: (hooks - hooks-no-first) CPU time / the calls of update_from_output"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_replay_arguments(parser)
    parser.set_defaults(trace=SAMPLE_TRACE, num_blocks=1200)  # the sample's run
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--run", choices=CONFIGS, help=argparse.SUPPRESS)  # a child's run
    args = parser.parse_args()
    if args.run:
        print(json.dumps(run_once(args)))
        return
    print(
        f"{args.trace.name}{f' (first {args.limit})' if args.limit else ''}, block size "
        f"{args.block_size}, {args.num_blocks} blocks, {args.max_num_seqs} sequences, "
        f"{args.max_num_batched_tokens} tokens a step, {args.rounds} rounds"
    )
    report(run_rounds(args))


if __name__ == "__main__":
    main()
