"""The scheduler replay against the step model and the one-pass curve: speed and hits.

On the same parsed trace (reading the file is not timed), side by side in one run:
  curve      the block stream and the one-pass curve at every pool size at once
  steps      `--timing timestamps`: kvscope's step model over vLLM's KV cache manager
  scheduler  `--timing scheduler`: vLLM's own Scheduler, schedule() and update_from_output()
             every step
The replays run bare (no hooks, no run file: what the hooks and DuckDB add is the same for
both). Prints each one's CPU seconds, requests per second and token hit ratio, the ratios
scheduler / steps and scheduler / curve, and what a 12-point sweep of the trace costs on
this machine's cores with the scheduler timing.

    python benchmarks/scheduler_replay.py [--block-size 16] [--num-blocks 20000]
        [--max-num-seqs 256] [--max-num-batched-tokens 8192] [--limit N]
"""

from __future__ import annotations

import argparse
import os
import time

from replay_args import add_replay_arguments

from collector.model.block_stream import trace_block_stream
from collector.model.mrc import miss_ratio_curve
from collector.model.step_model import StepModel
from collector.model.trace_request import TraceRequest
from collector.replay.block_manager import CacheSettings, make_block_hasher, make_kv_cache_manager
from collector.replay.scheduler_replay import SchedulerLimits, SchedulerReplay
from collector.replay.simulator import Simulator, VirtualClock
from collector.replay.traces import read_trace


def time_curve(requests: list[TraceRequest], settings: CacheSettings) -> tuple[float, float]:
    start = time.process_time()
    curve = miss_ratio_curve(trace_block_stream(requests, settings.block_size), settings.block_size)
    ratio = curve.token_hit_ratio(settings.num_blocks)
    return time.process_time() - start, ratio


def time_steps(
    requests: list[TraceRequest], settings: CacheSettings, max_num_seqs: int
) -> tuple[float, float]:
    start = time.process_time()
    manager = make_kv_cache_manager(settings)
    simulator = Simulator(
        manager, None, VirtualClock(), make_block_hasher(settings), on_step=lambda: None
    )
    simulator.run_timestamps(requests, max_num_seqs, StepModel(), lambda _: None)
    stats = manager.make_prefix_cache_stats()
    return time.process_time() - start, stats.hits / stats.queries


def time_scheduler(
    requests: list[TraceRequest], settings: CacheSettings, limits: SchedulerLimits
) -> tuple[float, float]:
    start = time.process_time()
    replay = SchedulerReplay(
        settings,
        limits,
        step_model=StepModel(),
        block_hasher=make_block_hasher(settings),
        clock=VirtualClock(),
        on_step=lambda: None,
    )
    replay.run(requests, lambda _: None)
    return time.process_time() - start, replay.prefix_cache_hits / replay.prefix_cache_queries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_replay_arguments(parser)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    args = parser.parse_args()
    requests = read_trace(args.trace)[: args.limit] if args.limit else read_trace(args.trace)
    settings = CacheSettings(args.block_size, args.num_blocks)
    limits = SchedulerLimits(args.max_num_seqs, args.max_num_batched_tokens)
    time_scheduler(requests[:20], settings, limits)  # vLLM imported and warm before timing
    results = {
        "curve": time_curve(requests, settings),
        "steps": time_steps(requests, settings, args.max_num_seqs),
        "scheduler": time_scheduler(requests, settings, limits),
    }
    print(
        f"{args.trace.name}: {len(requests):,} requests, block size {args.block_size}, "
        f"{args.num_blocks:,} blocks, {args.max_num_seqs} sequences, "
        f"{args.max_num_batched_tokens} tokens a step"
    )
    print(f"{'':>10} {'CPU s':>8} {'requests/s':>11} {'token hit':>9}")
    for name, (seconds, ratio) in results.items():
        print(f"{name:>10} {seconds:>8.2f} {len(requests) / seconds:>11,.0f} {ratio:>9.4f}")
    scheduler_s = results["scheduler"][0]
    print(
        f"scheduler / steps: {scheduler_s / results['steps'][0]:.2f}x the time; "
        f"scheduler / curve: {scheduler_s / results['curve'][0]:.1f}x"
    )
    cores = os.cpu_count() or 1
    print(
        f"a 12-point sweep with the scheduler timing: about {12 * scheduler_s / cores:,.0f} s "
        f"on {cores} cores (`kvscope whatif --jobs {cores}`, before the hooks and run files)"
    )


if __name__ == "__main__":
    main()
