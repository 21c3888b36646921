"""Overhead of kvscope's hooks on vLLM's real KV cache manager, measured side by side.

Replays the Mooncake synthetic trace (sequential timing) through a fresh `KVCacheManager`
per run, in these configurations, interleaved round-robin so drift hits all alike:
  bare        no hooks, no KV events
  kv-events   vLLM's own KV events on, drained every step (what --kv-events-config costs)
  hooks       kvscope's hooks attached, records drained every step (the capture cost)
  capture     hooks + the transport thread shipping msgpack batches to a real
              `kvscope collect` process that writes DuckDB (what an engine pays live)
  capture+collisions  as capture, with the collision check on (fingerprints per block)
Prints each configuration's median CPU time (process time: steadier than wall time on a
shared machine) and the median over rounds of its time / the same round's bare time.
Only the replaying process's CPU is counted (the collector is another process, and every
run waits until the collector has gone quiet: on a 2-core machine a collector still writing
the last capture's records slows the other core's run by up to a third). Trace
reading is not timed; prompt hashing by vLLM is (it is part of every engine's work).
Like vLLM's EngineCore, each run freezes the startup heap (`freeze_gc_heap`) before it starts.

    python benchmarks/hooks_overhead.py [--block-size 16] [--num-blocks 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.support

from process_cpu import cpu_ticks
from vllm.utils.gc_utils import freeze_gc_heap

from collector.replay.block_manager import CacheSettings, make_block_hasher, make_kv_cache_manager
from collector.replay.simulator import Simulator, VirtualClock
from collector.replay.traces import TraceRequest, read_trace
from engine_hooks import EventBuffer, KVCacheHooks, Pseudonymizer
from engine_hooks.transport import Transport
from tests.support.engine import collector_process as kvscope_collect

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "shared/traces/mooncake/synthetic_trace.jsonl"


def run_once(
    config: str, requests: list[TraceRequest], settings: CacheSettings, endpoint: str
) -> tuple[float, int]:
    """One replay; returns CPU seconds and records captured."""
    manager = make_kv_cache_manager(settings, kv_events=config == "kv-events")
    block_hasher = make_block_hasher(settings)
    clock = VirtualClock()
    hooks: KVCacheHooks | None = None
    transport: Transport | None = None
    buffer = EventBuffer()
    captured = [0]
    drain: Callable[[], None] = lambda: None  # noqa: E731
    if config == "kv-events":

        def drain() -> None:
            captured[0] += len(manager.take_events())
    elif config != "bare":
        hooks = KVCacheHooks(
            manager,
            buffer,
            pseudonymizer=Pseudonymizer(b"bench"),
            clock=clock,
            check_collisions=config == "capture+collisions",
        )
        hooks.attach()
        if config == "hooks":

            def drain() -> None:
                captured[0] += len(buffer.take())
        else:
            run_config = {
                "block_size": settings.block_size,
                "num_blocks": settings.num_blocks,
                "hash_algo": settings.hash_algo,
                "vllm_version": "bench",
            }
            transport = Transport(
                buffer, endpoint, engine_id=f"bench-{time.monotonic_ns()}", config=run_config
            )
    simulator = Simulator(manager, hooks, clock, block_hasher, on_step=drain)
    # As vLLM's EngineCore does once it is built: the startup heap leaves the GC's sight.
    freeze_gc_heap()
    start = time.process_time()
    if transport is not None:
        transport.start()
    simulator.run_sequential(requests, lambda _: None)
    if transport is not None:
        transport.stop(flush_timeout_s=120)
        captured[0] = transport.num_delivered
        if transport.num_dropped:
            print(f"    {transport.num_dropped:,} records dropped in transport")
    elapsed = time.process_time() - start
    if hooks is not None:
        hooks.detach()
    gc.unfreeze()
    return elapsed, captured[0]


@dataclass
class Collector:
    """A running `kvscope collect`: where to send, and its process."""

    endpoint: str
    process: subprocess.Popen[str]

    def wait_until_quiet(self, quiet_s: float = 1.0, limit_s: float = 600) -> None:
        """Wait until the collector has used (almost) no CPU for `quiet_s` (Linux only)."""
        pid = self.process.pid
        if not Path(f"/proc/{pid}").exists():
            return
        deadline = time.monotonic() + limit_s
        last = cpu_ticks(pid)
        while time.monotonic() < deadline:
            time.sleep(quiet_s)
            now = cpu_ticks(pid)
            if now - last <= 2:  # clock ticks: the collector's idle poll, nothing more
                return
            last = now


@contextmanager
def collector_process() -> Iterator[Collector]:
    """A real `kvscope collect` writing to a throwaway run file."""
    with tempfile.TemporaryDirectory() as directory:
        endpoint = f"ipc://{directory}/bench.ipc"
        run = Path(directory) / "bench.duckdb"
        with kvscope_collect(run, endpoint, "--live-interval", "3600") as process:
            yield Collector(endpoint, process)


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
        "--configs",
        default="bare,kv-events,hooks,capture,capture+collisions",
        help="comma-separated",
    )
    args = parser.parse_args()
    requests = read_trace(args.trace)[: args.limit]
    settings = CacheSettings(args.block_size, args.num_blocks)
    configs = args.configs.split(",")
    if "bare" not in configs:
        parser.error("--configs must include bare: every ratio is to bare")
    tally = Tally()
    print(
        f"{len(requests)} requests, block size {args.block_size}, {args.num_blocks} blocks, "
        f"{args.rounds} rounds (CPU seconds)"
    )
    with collector_process() as collector:
        for round_number in range(args.rounds):
            run_round(
                round_number,
                configs,
                requests=requests,
                settings=settings,
                collector=collector,
                tally=tally,
            )
    print(
        f"\n{'config':<19} {'median s':>9} {'x bare':>7}  {'per-round x bare':<24} {'records':>11}"
    )
    for config in configs:
        per_round = " ".join(f"{ratio:.3f}" for ratio in tally.ratios[config])
        print(
            f"{config:<19} {statistics.median(tally.times[config]):9.2f} "
            f"{statistics.median(tally.ratios[config]):7.3f}  {per_round:<24} "
            f"{tally.records[config]:>11,}"
        )
    print("x bare: the median over rounds of each round's time / that round's bare time")


@dataclass
class Tally:
    """Per configuration: CPU seconds and ratios to bare, one entry per round."""

    times: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    ratios: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    records: dict[str, int] = field(default_factory=dict)


def run_round(
    round_number: int,
    configs: list[str],
    *,
    requests: list[TraceRequest],
    settings: CacheSettings,
    collector: Collector,
    tally: Tally,
) -> None:
    """One round: every configuration once, in an order rotated by the round number."""
    shift = round_number % len(configs)
    this_round: dict[str, float] = {}
    for config in configs[shift:] + configs[:shift]:
        collector.wait_until_quiet()
        elapsed, captured = run_once(config, requests, settings, collector.endpoint)
        this_round[config] = elapsed
        tally.times[config].append(elapsed)
        tally.records[config] = captured
        print(f"  round {round_number + 1} {config:<19} {elapsed:7.2f} s {captured:>11,} records")
    for config, elapsed in this_round.items():
        tally.ratios[config].append(elapsed / this_round["bare"])


if __name__ == "__main__":
    main()
