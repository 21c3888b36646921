"""Overhead of kvscope's hooks on vLLM's real KV cache manager, measured side by side.

Replays the Mooncake synthetic trace (sequential timing) through a fresh `KVCacheManager`
per run, in these configurations, interleaved round-robin so drift hits all alike:
  bare        no hooks, no KV events
  kv-events   vLLM's own KV events on, drained every step (what --kv-events-config costs)
  hooks       kvscope's hooks attached, records drained every step (the capture cost)
  hooks+wire  as hooks, and every drained batch encoded to msgpack (what transport adds)
Prints each configuration's median CPU time (process time: steadier than wall time on a
shared machine) and the median over rounds of its time / the same round's bare time.
Trace reading is not timed; prompt hashing by vLLM is (it is part of every engine's work).
Like vLLM's EngineCore, each run freezes the startup heap (`freeze_gc_heap`) before it starts.

    python benchmarks/hooks_overhead.py [--block-size 16] [--num-blocks 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from vllm.utils.gc_utils import freeze_gc_heap

from collector.block_manager import CacheSettings, make_block_hasher, make_kv_cache_manager
from collector.simulator import Simulator, VirtualClock
from collector.traces import TraceRequest, read_trace
from engine_hooks import EventBuffer, KVCacheHooks, Pseudonymizer
from engine_hooks.events import encoder

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "shared/traces/mooncake/synthetic_trace.jsonl"


def run_once(
    config: str, requests: list[TraceRequest], settings: CacheSettings
) -> tuple[float, int]:
    """One replay; returns seconds and records captured."""
    manager = make_kv_cache_manager(settings, kv_events=config == "kv-events")
    block_hasher = make_block_hasher(settings)
    clock = VirtualClock()
    hooks: KVCacheHooks | None = None
    buffer = EventBuffer()
    captured = [0]
    drain: Callable[[], None]
    if config == "bare":

        def drain() -> None:
            return None
    elif config == "kv-events":

        def drain() -> None:
            captured[0] += len(manager.take_events())
    else:
        hooks = KVCacheHooks(manager, buffer, pseudonymizer=Pseudonymizer(b"bench"), clock=clock)
        hooks.attach()
        wire = encoder() if config == "hooks+wire" else None

        def drain() -> None:
            records = buffer.take()
            captured[0] += len(records)
            if wire is not None:
                wire.encode(records)

    simulator = Simulator(manager, hooks, clock, block_hasher, on_step=drain)
    # As vLLM's EngineCore does once it is built: the startup heap leaves the GC's sight.
    freeze_gc_heap()
    start = time.process_time()
    simulator.run_sequential(requests, lambda _: None)
    elapsed = time.process_time() - start
    if hooks is not None:
        hooks.detach()
    gc.unfreeze()
    return elapsed, captured[0]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-blocks", type=int, default=20_000)
    parser.add_argument("--limit", type=int, default=None, help="first N requests only")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--configs", default="bare,kv-events,hooks,hooks+wire", help="comma-separated"
    )
    args = parser.parse_args()
    requests = read_trace(args.trace)[: args.limit]
    settings = CacheSettings(args.block_size, args.num_blocks)
    configs = args.configs.split(",")
    if "bare" not in configs:
        parser.error("--configs must include bare: every ratio is to bare")
    times: dict[str, list[float]] = {config: [] for config in configs}
    ratios: dict[str, list[float]] = {config: [] for config in configs}
    records: dict[str, int] = {}
    print(
        f"{len(requests)} requests, block size {args.block_size}, {args.num_blocks} blocks, "
        f"{args.rounds} rounds (CPU seconds)"
    )
    for round_number in range(args.rounds):
        # Rotate the order each round so no configuration always runs first or last.
        shift = round_number % len(configs)
        this_round: dict[str, float] = {}
        for config in configs[shift:] + configs[:shift]:
            elapsed, captured = run_once(config, requests, settings)
            this_round[config] = elapsed
            times[config].append(elapsed)
            records[config] = captured
            print(
                f"  round {round_number + 1} {config:<11} {elapsed:7.2f} s {captured:>10,} records"
            )
        for config, elapsed in this_round.items():
            ratios[config].append(elapsed / this_round["bare"])
    print(
        f"\n{'config':<11} {'median s':>9} {'x bare':>7}  {'per-round x bare':<24} {'records':>10}"
    )
    for config in configs:
        per_round = " ".join(f"{ratio:.3f}" for ratio in ratios[config])
        print(
            f"{config:<11} {statistics.median(times[config]):9.2f} "
            f"{statistics.median(ratios[config]):7.3f}  {per_round:<24} {records[config]:>10,}"
        )
    print("x bare: the median over rounds of each round's time / that round's bare time")


if __name__ == "__main__":
    main()
