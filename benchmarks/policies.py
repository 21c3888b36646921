"""Cache policies against the optimal ceiling on a trace, at several pool sizes.

For each pool size: the token hit ratio under vLLM's LRU, LRU with the hottest prefix
families pinned, LRU that does not cache one-off families (admission), and Belady's MIN, the
best any policy that keeps prefixes can do; and how far LRU is from MIN. One request at a
time (collector/model/policies.py); the LRU figures are checked against the one-pass curve.
With --tiers, also LRU with a CPU tier of that many times the GPU pool behind it, under
vLLM's own offloading manager and each --tier-policies policy: the GPU's share and the
tier's added share.

    python benchmarks/policies.py [--trace TRACE] [--block-size 16]
        [--num-blocks 20000,80000,320000] [--pin-families 10] [--admission-window 100]
        [--tiers 2,4] [--tier-policies lru,arc]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from replay_args import DEFAULT_TRACE

from collector.model.block_stream import trace_block_stream
from collector.model.mrc import miss_ratio_curve
from collector.model.policies import hottest_families, one_off_families, replay_policy
from collector.replay.cpu_tier import CpuTier
from collector.replay.traces import read_trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-blocks", default="20000,80000,320000")
    parser.add_argument("--pin-families", type=int, default=10)
    parser.add_argument("--admission-window", type=int, default=100)
    parser.add_argument("--tiers", default="", help="CPU tier sizes, times the GPU pool")
    parser.add_argument("--tier-policies", default="lru,arc")
    args = parser.parse_args()
    stream = trace_block_stream(read_trace(args.trace), args.block_size)
    curve = miss_ratio_curve(stream, args.block_size)
    pinned = [
        key for keys in hottest_families(stream, args.block_size, args.pin_families) for key in keys
    ]
    one_offs = one_off_families(stream, args.block_size, args.admission_window)
    dropped = [key for keys in one_offs for key in keys]
    print(
        f"{args.trace.name}: {len(stream):,} requests, block size {args.block_size}; pinning "
        f"the {args.pin_families} hottest families ({len(pinned):,} blocks at most); "
        f"{len(one_offs):,} families not reused within {args.admission_window} requests "
        "left uncached"
    )
    print(
        f"{'blocks':>8} {'lru':>7} {'pin':>7} {'admit':>7} {'min':>7} {'lru/min':>8} "
        f"{'curve':>7} {'seconds':>8}"
    )
    for num_blocks in (int(size) for size in args.num_blocks.split(",")):
        start = time.process_time()
        ratios = {
            policy: replay_policy(
                stream, args.block_size, num_blocks, policy, pinned=pinned, not_admitted=dropped
            ).token_hit_ratio
            for policy in ("lru", "pin", "admit", "min")
        }
        seconds = time.process_time() - start
        print(
            f"{num_blocks:>8,} {ratios['lru']:>7.4f} {ratios['pin']:>7.4f} "
            f"{ratios['admit']:>7.4f} {ratios['min']:>7.4f} "
            f"{ratios['lru'] / ratios['min']:>8.3f} {curve.token_hit_ratio(num_blocks):>7.4f} "
            f"{seconds:>8.1f}"
        )
        for times in (int(size) for size in args.tiers.split(",") if size):
            for policy in args.tier_policies.split(","):
                start = time.process_time()
                tier = CpuTier(times * num_blocks, policy)
                result = replay_policy(stream, args.block_size, num_blocks, tier=tier)
                print(
                    f"{'':>8} + CPU tier {times}x ({times * num_blocks:,} blocks, {policy}): "
                    f"{result.token_hit_ratio:.4f} (GPU {result.gpu_token_hit_ratio:.4f}, "
                    f"tier +{result.token_hit_ratio - result.gpu_token_hit_ratio:.4f}); "
                    f"{tier.counts.stores:,} blocks stored, {tier.counts.hits:,} loaded; "
                    f"{time.process_time() - start:.0f} s"
                )


if __name__ == "__main__":
    main()
