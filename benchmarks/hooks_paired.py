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
  bare                  no hooks, no KV events
  kv-events             vLLM's own KV events on, drained every step
  hooks                 kvscope's hooks attached, records drained every step, fingerprints
                        off (KVSCOPE_CHECK_COLLISIONS=0)
  hooks+fingerprints    as hooks, with the fingerprints on (the default): one pass per block
                        gives the key-free fingerprint each `Store` carries and the collision
                        check's, checked on every prefix hit
  capture               hooks + the transport thread shipping msgpack batches to a real
                        `kvscope collect` process, fingerprints off. Its time is its
                        manager's share of the main thread plus its transport's threads' CPU
                        (encoding and sending; read per thread from /proc, and while it stops
                        and flushes, the process's other threads less the other transport's).
                        Its transport wakes every 0.05 s times the configurations: each takes
                        about that share of the wall time, so it wakes as often per second of
                        its own work as alone (on this project's VM a wake costs 0.2-0.35 ms
                        of CPU, so waking for the other configurations' time would bill
                        capture for them)
  capture+fingerprints  as capture, fingerprints on: what KVSCOPE_CAPTURE=1 costs by default
Each configuration with a goal prints it and PASS or MISS: hooks 1.05x bare and capture
1.10x without the fingerprints, 1.15x and 1.20x with them (issue 38).
The collector runs beside all of them, so its load on the machine falls on each alike; the
records it was sent and the ones dropped in transport are printed. (Its own CPU time is
`hooks_overhead.py`'s to measure: here its batches come over the whole pass, seven times
longer than capture alone.) Trace reading is not timed; prompt hashing by vLLM is.

    python benchmarks/hooks_paired.py [--block-size 16] [--num-blocks 20000] [--limit N]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import signal
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

CONFIGS = (
    "bare",
    "kv-events",
    "hooks",
    "hooks+fingerprints",
    "capture",
    "capture+fingerprints",
)
CAPTURES = ("capture", "capture+fingerprints")
GOALS = {"hooks": 1.05, "capture": 1.10, "hooks+fingerprints": 1.15, "capture+fingerprints": 1.20}


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
        fingerprints = config.endswith("+fingerprints")
        hooks = attach_hooks(manager, buffer, clock, check_collisions=fingerprints)
        drain = buffer.take
    if config in CAPTURES:
        # Each configuration's turns take about an equal share of the pass's wall time: waking
        # that many times less often gives its transport the wakes it gets alone at 0.05 s.
        interval_s = DEFAULT_INTERVAL_S * len(CONFIGS)
        transport = bench_transport(
            buffer, endpoint, settings, engine_id=f"bench-{config}", interval_s=interval_s
        )
        drain = _nothing  # the transport's thread drains the buffer
    simulator = Simulator(manager, hooks, clock, make_block_hasher(settings), on_step=drain)
    return simulator, transport


def _tasks() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def _cpu_ns(tasks: set[str]) -> int:
    """The CPU time of these threads of this process (those still running)."""
    total = 0
    for task in tasks:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            total += int(Path(f"/proc/self/task/{task}/schedstat").read_text().split()[0])
    return total


def _other_threads_ns() -> int:
    """The CPU time of every thread of this process but this one."""
    return time.process_time_ns() - time.thread_time_ns()


def start_transports(transports: dict[str, Any]) -> dict[str, set[str]]:
    """Start each transport; the threads each started (its own, and ZMQ's)."""
    threads = {}
    for config, transport in transports.items():
        before = _tasks()
        transport.start()
        threads[config] = _tasks() - before
    return threads


def stop_transports(transports: dict[str, Any], threads: dict[str, set[str]]) -> dict[str, int]:
    """Stop each transport in turn (it flushes); the CPU nanoseconds of each: its threads',
    read before it stops, and the process's other threads' while it stops, less what the
    transports still running spent meanwhile (theirs)."""
    spent = {}
    running = dict(threads)
    for config, transport in transports.items():
        before = {name: _cpu_ns(tasks) for name, tasks in running.items()}
        others_before = _other_threads_ns()
        transport.stop(flush_timeout_s=600)
        stopping = _other_threads_ns() - others_before
        del running[config]
        meanwhile = sum(_cpu_ns(tasks) - before[name] for name, tasks in running.items())
        spent[config] = before[config] + stopping - meanwhile
    return spent


def run_paired(args: argparse.Namespace, endpoint: str) -> dict[str, Any]:
    """Every request to every configuration in turn; CPU seconds per configuration."""
    from vllm.utils.gc_utils import freeze_gc_heap  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    requests = read_trace(args.trace)[: args.limit]
    built = {config: build(config, args, endpoint) for config in CONFIGS}
    simulators = {config: simulator for config, (simulator, _) in built.items()}
    transports = {config: built[config][1] for config in CAPTURES}
    spent = dict.fromkeys(CONFIGS, 0)
    freeze_gc_heap()  # as vLLM's EngineCore does once it is built
    others_start = _other_threads_ns()
    threads = start_transports(transports)
    for index, request in enumerate(requests):
        turn = index % len(CONFIGS)
        for config in CONFIGS[turn:] + CONFIGS[:turn]:
            started = time.thread_time_ns()
            simulators[config].run_sequential([request], lambda _: None, first_index=index)
            spent[config] += time.thread_time_ns() - started
    transport_ns = stop_transports(transports, threads)
    others_ns = _other_threads_ns() - others_start
    gc.unfreeze()
    for config in CAPTURES:
        spent[config] += transport_ns[config]
    return {
        "cpu_s": {config: spent[config] / 1e9 for config in CONFIGS},
        "transport_s": {config: transport_ns[config] / 1e9 for config in CAPTURES},
        "unbilled_s": (others_ns - sum(transport_ns.values())) / 1e9,
        "records": {config: transports[config].num_delivered for config in CAPTURES},
        "dropped": {config: transports[config].num_dropped for config in CAPTURES},
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
        collector = stack.enter_context(
            collector_process(directory / "bench.duckdb", endpoint, "--live-interval", "3600")
        )
        report(args, run_paired(args, endpoint))
        # Two whole captures' derived tables take the collector past a test's minute to finish.
        collector.send_signal(signal.SIGTERM)
        collector.wait(timeout=1800)


def report(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """The CPU seconds and ratios of every configuration, with the goals' verdicts."""
    cpu_s = result["cpu_s"]
    print(
        f"{args.trace.name}, block size {args.block_size}, {args.num_blocks} blocks, "
        f"{result['requests']:,} requests, paired request by request"
    )
    for config in CONFIGS:
        ratio = cpu_s[config] / cpu_s["bare"]
        goal = GOALS.get(config)
        verdict = ""
        if goal is not None:
            verdict = f"  goal {goal:.2f}x: {'PASS' if ratio <= goal else 'MISS'}"
        print(f"  {config:<21} {cpu_s[config]:8.2f} CPU s  {ratio:6.3f}x{verdict}")
    for config in CAPTURES:
        print(
            f"  {config}: {result['transport_s'][config]:.2f} CPU s in its transport's threads; "
            f"{result['records'][config]:,} records delivered, "
            f"{result['dropped'][config]:,} dropped in transport"
        )
    print(f"  other threads, billed to none: {result['unbilled_s']:.2f} CPU s")


if __name__ == "__main__":
    main()
