"""What capture costs vLLM's real KV cache manager, and whether the collector keeps up.

Replays the Mooncake synthetic trace (sequential timing) through a fresh `KVCacheManager`,
in these configurations, interleaved round-robin so drift hits all alike:
  bare                no hooks, no KV events
  kv-events           vLLM's own KV events on, drained every step (what --kv-events-config costs)
  hooks               kvscope's hooks attached, records drained every step
  capture             hooks + the transport thread shipping msgpack batches to a real
                      `kvscope collect` process that writes DuckDB: what KVSCOPE_CAPTURE=1
                      costs an engine with vLLM's default hash (sha256: no collision check)
  capture+collisions  as capture, with the collision check on (fingerprints per block)
  capture-to-sink     as capture, to a sink process that acknowledges each batch unread
                      (and keeps it): what the engine side of capture costs without a
                      collector's work beside it on the machine. The batches it kept are then
                      sent to a fresh `kvscope collect` with nothing else running, as fast as
                      it takes them: the collector's ingest rate on an idle machine, which is
                      where DuckDB's own insert is measured too
Every run is a fresh Python process (a run leaves a heap that slows the next: vLLM's KV
events alone leave 3.6 million objects), and every capture run a fresh collector.

Prints, per configuration: the median CPU seconds of the replaying process (every thread:
the transport's encoding and sending count) and the median over rounds of its ratio to the
same round's bare run; the records delivered and dropped in transport; the engine's peak
RSS. Per capture run: the collector's CPU seconds per engine CPU second and its peak RSS,
and its ingest rate (rows written per second of decoding, converting and committing, as
`kvscope collect` reports it) beside DuckDB's own Arrow insert of the same rows into a new
file, measured right after with the collector's DuckDB threads (`kvscope collect
--threads`, 1 by default): in one transaction, and in as many as the collector committed;
and with DuckDB's default threads (every core), in one transaction.
Trace reading is not timed; prompt hashing by vLLM is (it is part of every engine's work).
Like vLLM's EngineCore, each run freezes the startup heap (`freeze_gc_heap`) before it
starts.

    python benchmarks/hooks_overhead.py [--block-size 16] [--num-blocks 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.support

from capture_setup import attach_hooks, bench_transport
from process_cpu import CLOCK_TICKS, cpu_ticks
from replay_args import add_replay_arguments

from collector.live.receiver import INGEST_THREADS
from collector.replay.block_manager import CacheSettings, make_block_hasher, make_kv_cache_manager
from collector.replay.simulator import Simulator, VirtualClock
from collector.replay.traces import read_trace
from collector.store.insert_rate import duckdb_insert_rate
from engine_hooks import EventBuffer
from engine_hooks.transport import Ack, BatchHeader
from tests.support.engine import collector_process

CONFIGS = ("bare", "kv-events", "hooks", "capture", "capture+collisions", "capture-to-sink")
INGEST_LINE = re.compile(r"([\d,]+) rows written in ([\d.]+) s of ingest .*, ([\d,]+) commits")


def run_once(args: argparse.Namespace) -> dict[str, Any]:
    """One replay in this process (the child's side); returns what it measured."""
    from vllm.utils.gc_utils import freeze_gc_heap  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    config = args.run
    requests = read_trace(args.trace)[: args.limit]
    settings = CacheSettings(args.block_size, args.num_blocks)
    manager = make_kv_cache_manager(settings, kv_events=config == "kv-events")
    clock = VirtualClock()
    buffer = EventBuffer()
    hooks = None
    transport = None
    captured = [0]

    def drain() -> None:
        if config == "kv-events":
            captured[0] += len(manager.take_events())
        elif config == "hooks":
            captured[0] += len(buffer.take())

    if config not in ("bare", "kv-events"):
        hooks = attach_hooks(
            manager, buffer, clock, check_collisions=config == "capture+collisions"
        )
        if config != "hooks":
            transport = bench_transport(buffer, args.endpoint, settings)
    simulator = Simulator(manager, hooks, clock, make_block_hasher(settings), on_step=drain)
    freeze_gc_heap()  # as vLLM's EngineCore does once it is built
    start = time.process_time()
    if transport is not None:
        transport.start()
    simulator.run_sequential(requests, lambda _: None)
    dropped = 0
    if transport is not None:
        transport.stop(flush_timeout_s=300)
        captured[0] = transport.num_delivered
        dropped = transport.num_dropped
    elapsed = time.process_time() - start
    gc.unfreeze()
    return {
        "cpu_s": elapsed,
        "records": captured[0],
        "dropped": dropped,
        # Not getrusage: a forked child's ru_maxrss starts at its parent's peak.
        "peak_rss_mb": peak_rss_mb(os.getpid()),
    }


def run_sink(endpoint: str, keep: Path) -> None:
    """Acknowledge every batch as soon as it is kept in `keep`, reading only its header."""
    socket = zmq.Context().socket(zmq.ROUTER)
    socket.bind(endpoint)
    print("ready", flush=True)
    headers = msgspec.msgpack.Decoder(BatchHeader)
    encoder = msgspec.msgpack.Encoder()
    with keep.open("wb") as kept:
        while True:
            identity, header, records = socket.recv_multipart()
            for frame in (header, records):
                kept.write(len(frame).to_bytes(8, "little") + frame)
            kept.flush()
            batch_seq = headers.decode(header).batch_seq
            socket.send_multipart([identity, encoder.encode(Ack([batch_seq]))])


def kept_batches(keep: Path) -> list[list[bytes]]:
    """The (header, records) frames `run_sink` kept, in order."""
    data = keep.read_bytes()
    frames, offset = [], 0
    while offset < len(data):
        size = int.from_bytes(data[offset : offset + 8], "little")
        frames.append(data[offset + 8 : offset + 8 + size])
        offset += 8 + size
    return [frames[index : index + 2] for index in range(0, len(frames), 2)]


def collector_alone(keep: Path, directory: Path) -> dict[str, Any]:
    """Send the kept batches to a fresh `kvscope collect`, with nothing else running, as
    fast as it acknowledges them; its ingest rate beside DuckDB's own."""
    batches = kept_batches(keep)
    run_path = directory / "alone.duckdb"
    endpoint = f"ipc://{directory}/alone.ipc"
    with collector_process(run_path, endpoint, "--live-interval", "3600") as collector:
        context = zmq.Context()
        socket = context.socket(zmq.DEALER)
        socket.connect(endpoint)
        for frames in batches:  # ZMQ queues what the collector has not taken yet
            socket.send_multipart(frames)
        acks = msgspec.msgpack.Decoder(Ack)
        acknowledged = 0
        while acknowledged < len(batches):
            acknowledged += len(acks.decode(socket.recv()).batch_seqs)
        socket.close(linger=0)
        context.term()
        collector.send_signal(signal.SIGTERM)
        output, _ = collector.communicate(timeout=600)
    return {
        f"alone_{key}": value for key, value in ingest_rates(output, run_path, directory).items()
    }


def ingest_rates(output: str, run_path: Path, directory: Path) -> dict[str, Any]:
    """The ingest rate `kvscope collect` printed, and DuckDB's own insert of the same rows
    into a new file with the collector's threads (`INGEST_THREADS`): in one transaction, and
    in as many as the collector committed; and with DuckDB's default threads, in one."""
    match = INGEST_LINE.search(output)
    if match is None:
        raise RuntimeError(f"kvscope collect printed no ingest rate:\n{output}")
    rows, seconds = int(match[1].replace(",", "")), float(match[2])
    commits = int(match[3].replace(",", ""))
    return {
        "ingest_rows_per_s": rows / seconds,
        "duckdb_rows_per_s": duckdb_insert_rate(
            run_path, directory / "one.duckdb", threads=INGEST_THREADS
        ),
        "duckdb_same_commits_rows_per_s": duckdb_insert_rate(
            run_path, directory / "same.duckdb", commits, threads=INGEST_THREADS
        ),
        "duckdb_all_cores_rows_per_s": duckdb_insert_rate(run_path, directory / "all.duckdb"),
        "rows": rows,
        "commits": commits,
    }


@dataclass
class Tally:
    """Per configuration, one entry per round."""

    runs: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    ratios: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))


def measure(config: str, args: argparse.Namespace) -> dict[str, Any]:
    """One run in a fresh process; a capture run with a fresh collector beside it."""
    with ExitStack() as stack:
        directory = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        endpoint = f"ipc://{directory}/bench.ipc"
        run_path = directory / "bench.duckdb"
        collector = None
        keep = directory / "batches.bin"
        if config == "capture-to-sink":
            sink = subprocess.Popen(
                [sys.executable, __file__, "--sink", endpoint, "--keep", str(keep)],
                stdout=subprocess.PIPE,
                text=True,
            )
            stack.callback(sink.kill)
            assert sink.stdout is not None and sink.stdout.readline().strip() == "ready"
        elif config.startswith("capture"):
            collector = stack.enter_context(
                collector_process(run_path, endpoint, "--live-interval", "3600")
            )
            collector_start = cpu_ticks(collector.pid)
        command = [sys.executable, __file__, *child_arguments(args), "--run", config]
        child = subprocess.run(
            [*command, "--endpoint", endpoint],
            check=True,
            capture_output=True,
            text=True,
        )
        result: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
        if config == "capture-to-sink":
            sink.kill()
            result.update(collector_alone(keep, directory))
        if collector is None:
            return result
        result["collector_cpu_s"] = (cpu_ticks(collector.pid) - collector_start) / CLOCK_TICKS
        result["collector_peak_rss_mb"] = peak_rss_mb(collector.pid)
        collector.send_signal(signal.SIGTERM)
        output, _ = collector.communicate(timeout=600)
        result.update(ingest_rates(output, run_path, directory))
        return result


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child_arguments(args: argparse.Namespace) -> list[str]:
    limit = [] if args.limit is None else ["--limit", str(args.limit)]
    return [
        "--trace",
        str(args.trace),
        "--block-size",
        str(args.block_size),
        "--num-blocks",
        str(args.num_blocks),
        *limit,
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_replay_arguments(parser)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated")
    parser.add_argument("--run", choices=CONFIGS, help=argparse.SUPPRESS)  # a child's run
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--sink", help=argparse.SUPPRESS)  # an acking sink's endpoint
    parser.add_argument("--keep", type=Path, help=argparse.SUPPRESS)  # where it keeps batches
    args = parser.parse_args()
    if args.run:
        print(json.dumps(run_once(args)))
        return
    if args.sink:
        run_sink(args.sink, args.keep)
        return
    configs = args.configs.split(",")
    if "bare" not in configs or not set(configs) <= set(CONFIGS):
        parser.error(f"--configs: some of {', '.join(CONFIGS)}, bare among them")
    print(
        f"{args.trace.name}{f' (first {args.limit})' if args.limit else ''}, block size "
        f"{args.block_size}, {args.num_blocks} blocks, {args.rounds} rounds"
    )
    tally = Tally()
    for round_number in range(args.rounds):
        shift = round_number % len(configs)
        this_round: dict[str, float] = {}
        for config in configs[shift:] + configs[:shift]:
            result = measure(config, args)
            this_round[config] = result["cpu_s"]
            tally.runs[config].append(result)
            print(f"  round {round_number + 1} {config:<19} {describe(result)}", flush=True)
        for config, cpu_s in this_round.items():
            tally.ratios[config].append(cpu_s / this_round["bare"])
    report(configs, tally)


def describe(result: dict[str, Any]) -> str:
    text = (
        f"{result['cpu_s']:7.2f} CPU s {result['records']:>10,} records "
        f"{result['dropped']:>6,} dropped, peak RSS {result['peak_rss_mb']:,.0f} MB"
    )
    if "collector_cpu_s" in result:
        text += (
            f"; collector {result['collector_cpu_s']:.2f} CPU s, peak RSS "
            f"{result['collector_peak_rss_mb']:,.0f} MB, ingest {ingest_text(result, '')}"
        )
    if "alone_ingest_rows_per_s" in result:
        text += f"; collector alone, ingest {ingest_text(result, 'alone_')}"
    return text


def ingest_text(result: dict[str, Any], prefix: str) -> str:
    return (
        f"{result[prefix + 'rows']:,} rows at {result[prefix + 'ingest_rows_per_s']:,.0f} rows/s "
        f"in {result[prefix + 'commits']} commits (DuckDB's Arrow insert, same threads: "
        f"{result[prefix + 'duckdb_rows_per_s']:,.0f} in one, "
        f"{result[prefix + 'duckdb_same_commits_rows_per_s']:,.0f} in as many; every core: "
        f"{result[prefix + 'duckdb_all_cores_rows_per_s']:,.0f} in one)"
    )


def report(configs: list[str], tally: Tally) -> None:
    print(
        f"\n{'config':<19} {'CPU s':>6} {'x bare':>6}  {'per round':<20} {'dropped':>8} "
        f"{'RSS MB':>6}  {'collector CPU/engine CPU':>24} {'ingest/DuckDB 1 / same / all':>29} "
        f"{'collector RSS MB':>16}"
    )
    for config in configs:
        runs = tally.runs[config]
        per_round = " ".join(f"{ratio:.3f}" for ratio in tally.ratios[config])
        line = (
            f"{config:<19} {median(runs, 'cpu_s'):6.2f} "
            f"{statistics.median(tally.ratios[config]):6.3f}  {per_round:<20} "
            f"{max(run['dropped'] for run in runs):>8,} {median(runs, 'peak_rss_mb'):6,.0f}"
        )
        if "collector_cpu_s" in runs[0]:
            collector_share = statistics.median(
                run["collector_cpu_s"] / run["cpu_s"] for run in runs
            )
            line += (
                f"  {collector_share:24.2f} {ingest_shares(runs, '')} "
                f"{median(runs, 'collector_peak_rss_mb'):16,.0f}"
            )
        print(line)
        if "alone_ingest_rows_per_s" in runs[0]:
            print(f"{'  collector alone':<66} {'':>24} {ingest_shares(runs, 'alone_')}")
    print(
        "x bare: the median over rounds of each round's CPU time / that round's bare time; "
        "dropped: the most any round dropped in transport; ingest/DuckDB: the collector's rows "
        "per second of ingest over DuckDB's Arrow insert of the same rows with the collector's "
        "DuckDB threads, in one transaction / in as many as the collector committed, and with "
        "DuckDB's default threads (every core) in one (beside the engine; collector alone: the "
        "batches the sink kept, sent to a fresh collector with nothing else running)"
    )


def ingest_shares(runs: list[dict[str, Any]], prefix: str) -> str:
    """The collector's ingest rate over DuckDB's, per yardstick: the median over rounds."""
    one, same, every_core = (
        statistics.median(
            run[prefix + "ingest_rows_per_s"] / run[prefix + yardstick] for run in runs
        )
        for yardstick in (
            "duckdb_rows_per_s",
            "duckdb_same_commits_rows_per_s",
            "duckdb_all_cores_rows_per_s",
        )
    )
    return f"{one:13.2f} / {same:.2f} / {every_core:.2f}"


def median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


if __name__ == "__main__":
    main()
