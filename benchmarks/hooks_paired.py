"""What capture costs vLLM's real KV cache manager, measured paired: every configuration in
one process, request by request.

`hooks_overhead.py` runs each configuration in a fresh process, one after another; on a
shared machine whose speed drifts by a tenth or more from one minute to the next (steal,
another tenant's load), its ratios move by as much. Here one process builds a fresh
`KVCacheManager` per configuration and hands every request of the Mooncake synthetic trace
(sequential timing) to each of them in turn, the order rotating from request to request, and
times each manager's share with the main thread's CPU clock. A drift then slows every
configuration alike within milliseconds, and the ratios to `bare` keep only what the
configuration itself costs:
  bare                no hooks, no KV events
  kv-events           vLLM's own KV events on, drained every step
  hooks               kvscope's hooks attached, records drained every step
  hooks+collisions    as hooks, with the collision check on (fingerprints per block)
  capture             hooks + the transport thread shipping msgpack batches to a real
                      `kvscope collect` process: what KVSCOPE_CAPTURE=1 costs an engine with
                      vLLM's default hash (sha256: no collision check). Its time is its
                      manager's share of the main thread plus every other thread's CPU (the
                      transport's encoding and sending: no other configuration has threads).
                      Its transport wakes every 0.25 s instead of 0.05: capture's turns take
                      a fifth of the wall time, so it wakes as often per second of capture's
                      own work as alone (on this project's VM a wake costs 0.2-0.35 ms of
                      CPU, so waking for the other configurations' time would bill capture
                      for them)
The collector runs beside all of them, so its load on the machine falls on each alike; the
records it was sent and the ones dropped in transport are printed. (Its own CPU time is
`hooks_overhead.py`'s to measure: here its batches come over the whole pass, five times
longer than capture alone.) Trace reading is not timed; prompt hashing by vLLM is.

    python benchmarks/hooks_paired.py [--block-size 16] [--num-blocks 20000] [--limit N]
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.support

from capture_setup import attach_hooks, bench_transport
from replay_args import add_replay_arguments

from collector.replay.block_manager import CacheSettings, make_block_hasher, make_kv_cache_manager
from collector.replay.simulator import Simulator, VirtualClock
from collector.replay.traces import read_trace
from engine_hooks import EventBuffer
from engine_hooks.transport import DEFAULT_INTERVAL_S
from tests.support.engine import collector_process

CONFIGS = ("bare", "kv-events", "hooks", "hooks+collisions", "capture")


def _nothing() -> None:
    """What a step drains when nothing needs draining on the engine's thread."""


def build(config: str, args: argparse.Namespace, endpoint: str) -> tuple[Any, Any]:
    """A fresh manager for `config`, in a Simulator, and its transport (capture only)."""
    settings = CacheSettings(args.block_size, args.num_blocks)
    manager = make_kv_cache_manager(settings, kv_events=config == "kv-events")
    clock = VirtualClock()
    buffer = EventBuffer()
    hooks, transport = None, None
    drain: Callable[[], object] = _nothing
    if config == "kv-events":
        drain = manager.take_events
    if config not in {"bare", "kv-events"}:
        hooks = attach_hooks(manager, buffer, clock, check_collisions=config == "hooks+collisions")
        drain = buffer.take
    if config == "capture":
        # Capture's turns take a fifth of the pass's wall time: waking five times less often
        # gives its transport the wakes, and the batches, it gets alone at vLLM's 0.05 s.
        interval_s = DEFAULT_INTERVAL_S * len(CONFIGS)
        transport = bench_transport(buffer, endpoint, settings, interval_s=interval_s)
        drain = _nothing  # the transport's thread drains the buffer
    simulator = Simulator(manager, hooks, clock, make_block_hasher(settings), on_step=drain)
    return simulator, transport


def run_paired(args: argparse.Namespace, endpoint: str) -> dict[str, Any]:
    """Every request to every configuration in turn; CPU seconds per configuration."""
    from vllm.utils.gc_utils import freeze_gc_heap  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    requests = read_trace(args.trace)[: args.limit]
    built = {config: build(config, args, endpoint) for config in CONFIGS}
    simulators = {config: simulator for config, (simulator, _) in built.items()}
    transport = built["capture"][1]
    spent = dict.fromkeys(CONFIGS, 0)
    freeze_gc_heap()  # as vLLM's EngineCore does once it is built
    process_start, thread_start = time.process_time_ns(), time.thread_time_ns()
    transport.start()
    for index, request in enumerate(requests):
        turn = index % len(CONFIGS)
        for config in CONFIGS[turn:] + CONFIGS[:turn]:
            started = time.thread_time_ns()
            simulators[config].run_sequential([request], lambda _: None, first_index=index)
            spent[config] += time.thread_time_ns() - started
    transport.stop(flush_timeout_s=600)
    other_threads = (time.process_time_ns() - process_start) - (
        time.thread_time_ns() - thread_start
    )
    gc.unfreeze()
    spent["capture"] += other_threads
    return {
        "cpu_s": {config: spent[config] / 1e9 for config in CONFIGS},
        "transport_s": other_threads / 1e9,
        "records": transport.num_delivered,
        "dropped": transport.num_dropped,
        "requests": len(requests),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_replay_arguments(parser)
    args = parser.parse_args()
    with ExitStack() as stack:
        directory = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        endpoint = f"ipc://{directory}/bench.ipc"
        stack.enter_context(
            collector_process(directory / "bench.duckdb", endpoint, "--live-interval", "3600")
        )
        result = run_paired(args, endpoint)
    cpu_s = result["cpu_s"]
    print(
        f"{args.trace.name}, block size {args.block_size}, {args.num_blocks} blocks, "
        f"{result['requests']:,} requests, paired request by request"
    )
    for config in CONFIGS:
        print(f"  {config:<18} {cpu_s[config]:8.2f} CPU s  {cpu_s[config] / cpu_s['bare']:6.3f}x")
    print(
        f"  capture: {result['transport_s']:.2f} CPU s in the transport's threads; "
        f"{result['records']:,} records delivered, {result['dropped']:,} dropped in transport"
    )


if __name__ == "__main__":
    main()
