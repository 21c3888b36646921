"""What well-formed hostile messages do to a real `kvscope collect`: refusals, tracebacks,
peak memory. Each attack class runs against a fresh collector process whose address space
is capped (8 GiB by default: an attack that would take the host fails inside it), sent from
a plain pyzmq socket as any local user could; a valid batch follows every attack, and the
collector must still store it. Prints one Markdown row per class.

    .venv/bin/python benchmarks/hostile_messages.py [--tenants 1000000] [--engines 40000]
        [--repo PATH]   # another tree of kvscope (`git archive COMMIT`): to measure it

The engine flood claims pools of 2,000 blocks (within every limit); the tenant flood sends
an arrival and a lookup per tenant, 5,000 records a batch, and scrapes `/metrics` once.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zmq

from collector.store.run_file import RunFile, StoreError
from engine_hooks.events import (
    INT32_MAX,
    INT64_MAX,
    Allocate,
    Arrive,
    Event,
    Lookup,
    Pool,
    pack_counts,
)
from tests.support.hostile import CappedCollector, Sender, frames, header
from tests.support.hostile_stream import LIMITS, HostileStream, limit_args
from tests.support.ports import free_port
from tests.support.repo import REPO


@dataclass
class Outcome:
    inputs: str
    refused: str
    tracebacks: int
    peak_mb: float  # over the collector's life, its final rebuild of the run included
    receiving_mb: float  # until the attack and the good batch after it were taken
    survived: bool  # the valid batch after the attack was stored
    note: str = ""


def send_good(sender: Sender, seq: int, batch_seq: int) -> None:
    """A valid batch of an engine that sends before and after the attack."""
    records: list[Event] = [Pool(seq, 1, None, 1, None, 1)]
    sender.send(frames(header("good", records, dp_rank=1, batch_seq=batch_seq), records))


def good_stored(run: Path) -> bool:
    try:
        with RunFile.open(run) as run_file:
            row = run_file.row("SELECT count(*) FROM pool WHERE engine_id = 'good'")
    except StoreError:
        return False
    return bool(row and row[0] == 2)


def attack(
    folder: Path,
    repo: Path,
    cap: int,
    send: Callable[[Sender, Path], str],
    *args: str,
) -> Outcome:
    """Start a collector, `send` the attack (returns a note), then a valid batch; stop it."""
    run, endpoint = folder / "run.duckdb", f"ipc://{folder}/collect.ipc"
    collector = CappedCollector(run, endpoint, cap, *args, repo=repo)
    sender = Sender(endpoint)
    send_good(sender, 0, 10**9 - 1)
    sender.wait_for_ack(10**9 - 1)
    started = time.perf_counter()
    try:
        note = send(sender, run)
        send_good(sender, 1, 10**9)
    except zmq.Again:
        note = "the collector stopped taking messages"
    while collector.running():  # until the valid batch is stored, or the collector is gone
        try:
            sender.wait_for_ack(10**9, timeout_ms=1_000)
            break
        except AssertionError:
            continue
    elapsed = time.perf_counter() - started
    receiving = peak_resident(collector.process.pid)
    sender.close()
    exited = collector.stop()
    rejected = exited.rejected()
    refused = ", ".join(f"{count:,} {reason}" for reason, count in rejected.items()) or "0"
    return Outcome(
        "",
        refused,
        exited.output.count("Traceback"),
        exited.peak_rss_bytes / 1e6,
        receiving / 1e6,
        exited.returncode == 0 and good_stored(run),
        f"{note}{'; ' if note else ''}{elapsed:.1f} s; exit {exited.returncode}",
    )


def peak_resident(pid: int) -> int:
    """A live process's peak resident bytes so far (0 once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return int(status.split("VmHWM:")[1].split()[0]) * 1024


def pool_claim(sender: Sender, run: Path) -> str:
    records: list[Event] = [Allocate(0, 1, "r", pack_counts([INT32_MAX - 1]))]
    message = frames(header("x", records, num_blocks=INT32_MAX), records)
    sender.send(message)
    return f"{sum(map(len, message))} bytes"


def replays(sender: Sender, run: Path) -> str:
    for batch_seq in range(1_000):
        records: list[Event] = [Arrive(2 * batch_seq, 1, f"r{batch_seq}", 16)]
        records.append(Allocate(2 * batch_seq + 1, 1, f"r{batch_seq}", pack_counts([1, 2])))
        message = frames(header("e", records, batch_seq=batch_seq), records)
        sender.send(message)
        sender.send(message)
    return "1,000 batches, each twice"


def huge_seq(sender: Sender, run: Path) -> str:
    records: list[Event] = [Pool(INT64_MAX, 1, None, 1, None, 1)]
    sender.send(frames(header("e", records), records))
    return "one record numbered 2^63 - 1"


def engine_flood(count: int) -> Callable[[Sender, Path], str]:
    def send(sender: Sender, run: Path) -> str:
        for index in range(count):
            records: list[Event] = [Pool(0, 1, None, 1, None, 1)]
            engine, rank = f"fake-{index // 1000}", index % 1000
            sender.send(frames(header(engine, records, dp_rank=rank, batch_seq=index), records))
        return f"{count:,} engine and DP-rank pairs"

    return send


def tenant_flood(count: int, port: int) -> Callable[[Sender, Path], str]:
    def send(sender: Sender, run: Path) -> str:
        batch: list[Event] = []
        batch_seq = 0
        for index in range(count):
            batch.append(Arrive(2 * index, 1, f"r{index}", 64, tenant=f"tenant-{index}"))
            batch.append(Lookup(2 * index + 1, 1, f"r{index}", 64, 16, 1, False))
            if len(batch) >= 5_000 or index == count - 1:
                sender.send(frames(header("e", batch, batch_seq=batch_seq), batch))
                batch, batch_seq = [], batch_seq + 1
        sender.wait_for_ack(batch_seq - 1, timeout_ms=1_200_000)
        started = time.perf_counter()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=600) as response:
            size = len(response.read())
        return (
            f"{count:,} tenants; one scrape {size / 1e6:.2f} MB in "
            f"{time.perf_counter() - started:.2f} s"
        )

    return send


def fuzz(count: int) -> Callable[[Sender, Path], str]:
    def send(sender: Sender, run: Path) -> str:
        stream = HostileStream(seed=36)
        for _ in range(count):  # (the engine of the good batches takes one of its engines)
            sender.send(stream.message())
        return f"{count:,} seeded messages"

    return send


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=REPO, help="the kvscope tree to measure")
    parser.add_argument("--cap-gib", type=float, default=8.0, help="the collector's RLIMIT_AS")
    parser.add_argument("--engines", type=int, default=40_000)
    parser.add_argument("--tenants", type=int, default=1_000_000)
    parser.add_argument("--fuzz", type=int, default=12_000, help="hostile-stream messages")
    parser.add_argument("--only", nargs="*", help="classes to run (default: all)")
    args = parser.parse_args()
    cap = int(args.cap_gib * (1 << 30))
    port = free_port()
    fuzz_limits: list[str] = []
    if args.repo == REPO:
        fuzz_limits = limit_args(LIMITS)
    classes: dict[str, tuple[Callable[[Sender, Path], str], list[str]]] = {
        "pool claim": (pool_claim, []),
        "replayed batches": (replays, []),
        "record number 2^63-1": (huge_seq, []),
        "engine flood": (engine_flood(args.engines), []),
        "tenant flood": (tenant_flood(args.tenants, port), ["--metrics-port", str(port)]),
        "hostile-value fuzz": (fuzz(args.fuzz), fuzz_limits),
    }
    print(f"kvscope at {args.repo}, collector address space capped at {args.cap_gib} GiB\n")
    print(
        "| attack class | inputs | refused (by reason) | tracebacks | peak RSS receiving "
        "| peak RSS with the final rebuild | good batch after |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, (send, extra) in classes.items():
        if args.only and name not in args.only:
            continue
        with tempfile.TemporaryDirectory() as folder:
            outcome = attack(Path(folder), args.repo, cap, send, *extra)
        print(
            f"| {name} | {outcome.note} | {outcome.refused} | {outcome.tracebacks} | "
            f"{outcome.receiving_mb:,.0f} MB | {outcome.peak_mb:,.0f} MB | "
            f"{'stored' if outcome.survived else 'LOST'} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
