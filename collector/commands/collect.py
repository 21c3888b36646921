"""`kvscope collect`: receive a live engine's block events into a run file."""

from __future__ import annotations

import argparse
import re
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collector.live.exporter import serve_metrics
from collector.live.limits import LimitError, Limits
from collector.live.live_state import LiveState
from collector.live.receiver import MEMORY_LIMIT, Receiver
from collector.live.vllm_kv_subscriber import VllmKvEventSubscriber
from collector.store.run_file import RunConfig
from collector.store.segments import SegmentPolicy
from engine_hooks.endpoint import EndpointError, default_endpoint, engine_token

if TYPE_CHECKING:
    from collector.live.live_state import LiveState
    from collector.live.receiver import Receiver, ReceiverStats
    from collector.live.vllm_kv_subscriber import VllmKvEventSubscriber

_SIZE = re.compile(r"(?P<amount>\d+(\.\d+)?)\s*(?P<unit>[KMGT](?P<binary>i)?B)", re.IGNORECASE)


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "collect", help="receive block events from engines running kvscope's plugin"
    )
    parser.add_argument("--db", type=Path, required=True, help="run file to create (.duckdb)")
    parser.add_argument(
        "--endpoint",
        default=default_endpoint(),
        help="where engines send (KVSCOPE_ENDPOINT): ipc://PATH in a folder only you can use "
        "(default), or tcp://127.0.0.1:PORT with KVSCOPE_TOKEN set here and on the engines",
    )
    parser.add_argument(
        "--live-interval", type=float, default=5.0, help="seconds between live copies"
    )
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on 127.0.0.1")
    parser.add_argument(
        "--idle-exit",
        type=float,
        help="stop after this many seconds without a batch (counted from the first batch)",
    )
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        help="listen on an address other machines reach (tcp://HOST:PORT); engines must then "
        "present the token in KVSCOPE_TOKEN, set for the collector too",
    )
    _add_vllm_kv_options(parser)
    _add_run_options(parser)
    _add_segment_options(parser)
    parser.set_defaults(handler=_run_collect)


def _add_vllm_kv_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--vllm-kv-events",
        metavar="ENDPOINT",
        help="also subscribe to vLLM's own KV events (vllm serve --kv-events-config), "
        "e.g. tcp://127.0.0.1:5557",
    )
    parser.add_argument(
        "--vllm-kv-replay",
        metavar="ENDPOINT",
        help="vLLM's replay socket, to heal gaps (its replay_endpoint), e.g. tcp://127.0.0.1:5558",
    )
    parser.add_argument("--vllm-kv-topic", default="", help="the topic vLLM publishes on")


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--threads",
        type=int,
        help="DuckDB threads while engines run (default 1: the collector takes about one core "
        "beside the engine; the final rebuild uses every core)",
    )
    parser.add_argument(
        "--memory-limit",
        help="DuckDB memory at most, e.g. 6GB (the default); beyond it, it spills to "
        "RUN.duckdb.tmp/",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=16,
        help="for a run of vLLM KV events only: the engine's block size (the events do not "
        "say the pool's size or hash algorithm)",
    )
    parser.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="NAME=N",
        help="set one of the collector's limits on what engines claim "
        "(docs/privacy-and-security.md, Limits): engines, pool-blocks, total-pool-blocks, "
        "seq-jump, tokens, tenants, adapters, requests; e.g. --limit pool-blocks=8388608",
    )


def _add_segment_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--segment-rows",
        type=int,
        metavar="N",
        help="a segmented run, for capture that runs for weeks: close the open segment into "
        "Parquet every N rows (docs/run-files.md, Segmented runs); off by default",
    )
    parser.add_argument(
        "--segment-minutes",
        type=float,
        metavar="M",
        help="a segmented run: close the open segment every M minutes (or --segment-rows, "
        "whichever comes first)",
    )
    parser.add_argument(
        "--segment-dir",
        type=Path,
        metavar="DIR",
        help="where closed segments go (default: RUN.duckdb.segments beside --db); a folder "
        "several collectors share is fine, their files are named by run",
    )
    parser.add_argument(
        "--keep",
        type=float,
        metavar="DAYS",
        help="a segmented run: drop the closed segments closed more than DAYS days ago",
    )
    parser.add_argument(
        "--keep-size",
        metavar="SIZE",
        help="a segmented run: drop the oldest closed segments while those kept hold more "
        "than SIZE of Parquet, e.g. 200GB",
    )


def _segment_policy(args: argparse.Namespace) -> SegmentPolicy | None:
    """The segmented run asked for, if any."""
    if args.segment_rows is None and args.segment_minutes is None:
        return None
    return SegmentPolicy(
        args.segment_rows, args.segment_minutes, args.segment_dir, args.keep, _bytes(args.keep_size)
    )


def _bytes(size: str | None) -> int | None:
    """A size such as 200GB (10^9 bytes a GB) or 512MiB (2^20 a MiB) in bytes; None for
    none, and for one that is not a size (`_usage_problem` says so)."""
    found = _SIZE.fullmatch(size or "")
    if found is None:
        return None
    prefix, binary = found["unit"][0].upper(), bool(found["binary"])
    power = "KMGT".index(prefix) + 1
    return int(float(found["amount"]) * ((1024 if binary else 1000) ** power))


def _run_collect(args: argparse.Namespace) -> int:
    problem = _usage_problem(args)
    if problem is None:
        try:
            limits = Limits.parse(args.limit)
        except LimitError as error:
            problem = str(error)
    if problem is not None:
        print(f"kvscope collect: {problem}", file=sys.stderr)
        return 2

    state = LiveState(limits)
    if args.metrics_port is not None:  # before the run is opened: a taken port changes no run
        try:
            serve_metrics(state, args.metrics_port)
        except OSError as error:
            raise EndpointError(f"--metrics-port {args.metrics_port}: {error}") from None
    sources: tuple[VllmKvEventSubscriber, ...] = ()
    if args.vllm_kv_events:
        sources = (
            VllmKvEventSubscriber(args.vllm_kv_events, args.vllm_kv_replay, args.vllm_kv_topic),
        )
    receiver = _receiver(args, state, sources)
    stop = threading.Event()
    for signal_number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signal_number, lambda *_: stop.set())
    print(f"kvscope collect: listening on {args.endpoint}, writing {args.db}", flush=True)
    receiver.serve(stop, idle_exit_s=args.idle_exit)
    _print_stats(receiver.stats, sources)
    return 0


def _usage_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the options (`--threads`, `--memory-limit`, the segments'), if
    anything."""
    if args.threads is not None and args.threads < 1:
        return f"--threads {args.threads}: must be 1 or more"
    if args.memory_limit is not None and not MEMORY_LIMIT.fullmatch(args.memory_limit):
        return f"--memory-limit {args.memory_limit}: give an amount such as 6GB or 512MB"
    if args.segment_rows is not None and args.segment_rows < 1:
        return f"--segment-rows {args.segment_rows}: must be 1 or more"
    if args.keep is not None and not args.keep >= 0:
        return f"--keep {args.keep}: must be 0 days or more"
    if args.segment_minutes is not None and not args.segment_minutes > 0:
        return f"--segment-minutes {args.segment_minutes}: must be more than 0"
    if args.keep_size is not None and _bytes(args.keep_size) is None:
        return f"--keep-size {args.keep_size}: give a size such as 200GB or 512MB"
    if _segment_policy(args) is None and (
        args.keep is not None or args.keep_size is not None or args.segment_dir
    ):
        return (
            "--keep, --keep-size and --segment-dir need a segmented run (--segment-rows or "
            "--segment-minutes)"
        )
    return None


def _receiver(
    args: argparse.Namespace, state: LiveState, sources: tuple[VllmKvEventSubscriber, ...]
) -> Receiver:
    return Receiver(
        args.db,
        args.endpoint,
        live_interval_s=args.live_interval,
        observers=(state.observe,),
        kv_event_sources=sources,
        kv_event_run_config=RunConfig(
            source="vllm-kv-events",
            block_size=args.block_size,
            num_blocks=0,
            hash_algo="unknown",
            vllm_version="unknown",
            options={"endpoint": args.vllm_kv_events, "replay": args.vllm_kv_replay},
        ),
        allow_remote=args.allow_remote,
        token=engine_token(),
        limits=state.limits,
        segments=_segment_policy(args),
        **({"threads": args.threads} if args.threads is not None else {}),
        **({"memory_limit": args.memory_limit} if args.memory_limit is not None else {}),
    )


def _print_stats(stats: ReceiverStats, sources: tuple[VllmKvEventSubscriber, ...]) -> None:
    print(
        f"kvscope collect: {stats.records:,} records in {stats.batches:,} batches, "
        f"{stats.missing_records:,} missing, {stats.rejected.total:,} messages rejected",
        flush=True,
    )
    if stats.ingest_s:
        print(
            f"kvscope collect: {stats.rows:,} rows written in {stats.ingest_s:.2f} s of ingest "
            f"({stats.rows / stats.ingest_s:,.0f} rows/s), {stats.commits:,} commits",
            flush=True,
        )
    if stats.snapshots:
        print(
            f"kvscope collect: {stats.snapshots:,} live copies published, "
            f"{stats.snapshots_carried:,} of them carried over from the copy before",
            flush=True,
        )
    if stats.snapshot_failures:
        print(
            f"kvscope collect: {len(stats.snapshot_failures):,} live copies failed "
            f"({stats.snapshots:,} published); the last: {stats.snapshot_failures[-1]}",
            flush=True,
        )
    if stats.rejected.total:
        reasons = ", ".join(
            f"{count:,} {reason}" for reason, count in stats.rejected.by_reason.items()
        )
        print(f"kvscope collect: rejected {reasons}; the last: {stats.rejected.last}", flush=True)
    for source in sources:
        if source.rejected.total:
            reasons = ", ".join(
                f"{count:,} {reason}" for reason, count in source.rejected.by_reason.items()
            )
            print(f"kvscope collect: refused vLLM KV event batches: {reasons}", flush=True)
