"""The one-pass miss-ratio curve against replays through vLLM's real manager: time and figures.

Times, side by side in one run and on the same parsed trace (reading the file is not timed):
  curve   the block stream and the one-pass curve at every pool size at once
  replay  one sequential replay through a fresh vLLM `KVCacheManager` at one pool size, no
          hooks (the fastest replay there is; kvscope's hooks only add to it)
vLLM is imported before timing. Rounds alternate the order; prints each median CPU time and
the median ratio replay / curve.
With --compare, also replays at each listed pool size and prints the curve's block and token
hit ratios beside vLLM's.

    python benchmarks/mrc_speed.py [--block-size 512] [--num-blocks 10000] [--rounds 3]
        [--compare 1000,2000,5000,10000,20000,40000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from replay_args import DEFAULT_TRACE

from collector.model.block_stream import trace_block_stream
from collector.model.mrc import MissRatioCurve, miss_ratio_curve
from collector.model.trace_request import TraceRequest
from collector.replay.block_manager import CacheSettings, make_block_hasher, make_kv_cache_manager
from collector.replay.simulator import Simulator, VirtualClock
from collector.replay.traces import read_trace


def time_curve(requests: list[TraceRequest], block_size: int) -> tuple[float, MissRatioCurve]:
    start = time.process_time()
    curve = miss_ratio_curve(trace_block_stream(requests, block_size), block_size)
    return time.process_time() - start, curve


def time_replay(
    requests: list[TraceRequest], block_size: int, num_blocks: int
) -> tuple[float, int]:
    """CPU seconds of one bare sequential replay, and its prefix-hit tokens (vLLM's stats)."""
    start = time.process_time()
    settings = CacheSettings(block_size, num_blocks)
    manager = make_kv_cache_manager(settings)
    simulator = Simulator(
        manager, None, VirtualClock(), make_block_hasher(settings), on_step=lambda: None
    )
    simulator.run_sequential(requests, lambda _: None)
    hit_tokens = int(manager.make_prefix_cache_stats().hits)
    return time.process_time() - start, hit_tokens


def compare(requests: list[TraceRequest], curve: MissRatioCurve, sizes: list[int]) -> None:
    block_size = curve.block_size
    prompt_tokens = curve.prompt_tokens
    print(f"\n{'blocks':>8} {'curve blk':>9} {'vLLM blk':>9} {'curve tok':>9} {'vLLM tok':>9}")
    for num_blocks in sizes:
        _, hit_tokens = time_replay(requests, block_size, num_blocks)
        replay_blocks = hit_tokens / block_size / curve.prompt_blocks
        print(
            f"{num_blocks:>8,} {curve.block_hit_ratio(num_blocks):>9.4f} {replay_blocks:>9.4f} "
            f"{curve.token_hit_ratio(num_blocks):>9.4f} {hit_tokens / prompt_tokens:>9.4f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--block-size", type=int, default=512)
    parser.add_argument("--num-blocks", type=int, default=10_000, help="the timed replay's pool")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compare", default="", help="pool sizes to check the curve at")
    args = parser.parse_args()
    requests = read_trace(args.trace)
    time_replay(requests[:1], args.block_size, args.num_blocks)  # imports vLLM: not timed
    print(
        f"{len(requests)} requests, block size {args.block_size}; replay at {args.num_blocks} "
        f"blocks; {args.rounds} rounds (CPU seconds)"
    )
    curve_times, replay_times, ratios = [], [], []
    curve = None
    for round_number in range(args.rounds):
        timings = {}
        for name in ("curve", "replay") if round_number % 2 == 0 else ("replay", "curve"):
            if name == "curve":
                timings[name], curve = time_curve(requests, args.block_size)
            else:
                timings[name], _ = time_replay(requests, args.block_size, args.num_blocks)
        curve_times.append(timings["curve"])
        replay_times.append(timings["replay"])
        ratios.append(timings["replay"] / timings["curve"])
        print(
            f"  round {round_number + 1}: curve {timings['curve']:7.2f} s   replay "
            f"{timings['replay']:7.2f} s   replay / curve {ratios[-1]:6.1f}x"
        )
    print(
        f"\nmedian: one-pass curve (every pool size) {statistics.median(curve_times):.2f} s, "
        f"one replay (one pool size) {statistics.median(replay_times):.2f} s, "
        f"replay / curve {statistics.median(ratios):.1f}x"
    )
    assert curve is not None
    if args.compare:
        compare(requests, curve, [int(size) for size in args.compare.split(",")])


if __name__ == "__main__":
    main()
