"""What one live refresh of `kvscope collect` costs, part by part, at two run sizes.

Every `--live-interval` seconds while records arrive, the collector's writing thread folds
the new rows into the eviction ages and checkpoints the run file (`LiveCopy.publish`); when
a live copy is due, a worker thread copies the file's bytes and rebuilds the tables derived
whole in the copy, but for the cache lifetimes and the tables derived from them, carried
over from the copy before (collector/store/live_copy.py). This script builds runs of about 1 and 10
million rows: the sample workload (`kvscope generate`) drawn --copies times and replayed as
benchmarks/app_queries.py replays it, the stream's last 2 x --batches x --batch-records
records held back. Each run is built once (minutes) under --cache (default
/tmp/kvscope-bench) and never committed.

On a copy of each run, resumed as a collector restarted on it would open it, it times the
first refresh (the whole file is new to this process), then --batches rounds of three
refreshes: one with nothing new, one after appending the next batch of held-back records
(the stream goes on where the file stops: stores, hits and evictions of blocks the file
holds), and one after the batch after that which also makes a live copy. Each part is
timed alone: the flush of the batch, the fold and the checkpoint (the writer's), the copy
and every table rebuilt in it (the worker's, here run in turn). Prints seconds per part,
the median of the rounds, and each side's total: the writer's should not grow with the run.

    python benchmarks/live_refresh.py [--copies 10,100] [--batches 3] [--batch-records 5000]
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import time
from collections import deque
from pathlib import Path

import duckdb
import msgspec
from app_queries import OPTIONS, SECRET, workload_trace

from collector.live.receiver import INGEST_MEMORY_LIMIT, INGEST_THREADS
from collector.queries.summary import run_summary
from collector.replay.replayer import load_requests, replay_into
from collector.store.copy_carry import CopyCarry, PreviousCopy
from collector.store.run_file import (
    RunConfig,
    RunFile,
    RunStore,
    live_copy_draft_path,
    live_copy_path,
)
from collector.store.schema import CREATE_STATEMENTS, SCHEMA_VERSION
from engine_hooks.events import Event, decoder, encoder


class HoldingBack(RunStore):
    """A run store that keeps the last `num_held` records of its stream out of the file,
    and at the end refreshes the derived tables (as a live refresh did) without finishing."""

    def __init__(self, connection: duckdb.DuckDBPyConnection, path: Path) -> None:
        super().__init__(connection, path)
        self.held: deque[Event] = deque()
        self.num_held = 0

    def append(self, records: list[Event]) -> list[Event]:
        self.held.extend(records)
        overflow = len(self.held) - self.num_held
        if overflow <= 0:
            return []
        return super().append([self.held.popleft() for _ in range(overflow)])

    def finalize(self, vllm_prefix_cache: tuple[int, int] | None = None) -> None:
        self.refresh_derived(rebuild=True)


def build_run(cache: Path, copies: int, num_held: int) -> tuple[Path, list[Event]]:
    """An unfinished run of `copies` sample workloads without its last `num_held` records,
    and those records; replayed once and then reused while the run-file layout and the
    records' format hold."""
    records = msgspec.json.encode(msgspec.json.schema(list[Event]))
    layout = hashlib.sha256("".join(CREATE_STATEMENTS).encode() + records).hexdigest()[:8]
    run = cache / f"live-refresh-schema{SCHEMA_VERSION}-{layout}-{copies}x-{num_held}.duckdb"
    held = run.with_suffix(".held.msgpack")
    if not (run.exists() and held.exists()):
        trace = workload_trace(cache, copies)
        print(f"replaying {trace} into {run} (once; minutes)", flush=True)
        started = time.perf_counter()
        temporary = run.with_name(f".{run.name}.building")
        temporary.unlink(missing_ok=True)
        settings = OPTIONS.settings
        config = RunConfig(
            "replay", settings.block_size, settings.num_blocks, settings.hash_algo, "benchmark"
        )
        store = HoldingBack.create(temporary, config)
        store.num_held = num_held
        replay_into(store, load_requests(trace, OPTIONS), OPTIONS, SECRET, lambda _: None)
        held.write_bytes(encoder().encode(list(store.held)))
        store.close()
        temporary.rename(run)
        print(f"replayed in {time.perf_counter() - started:.0f} s", flush=True)
    return run, decoder().decode(held.read_bytes())


Timings = dict[str, float]
WORKER = "live copy: "  # the parts a collector's worker thread does


def timed_refresh(store: RunStore, records: list[Event], copies: TimedCopies | None) -> Timings:
    """Append `records`, then refresh as a collector's writing thread does, and make a live
    copy as its worker does if `copies` is given, part by part."""
    timings: Timings = {}
    started = time.perf_counter()
    store.append(records)
    store.flush()
    timings["flush (the new records)"] = time.perf_counter() - started
    for name, step in [*store.refresh_steps(rebuild=False), ("checkpoint", store.checkpoint)]:
        started = time.perf_counter()
        step()
        timings[name] = time.perf_counter() - started
    if copies is not None:
        timings |= copies.make()
    return timings


class TimedCopies:
    """The live copies of one store, made as `LiveCopy`'s worker makes them (each carrying
    the cache lifetimes and their rollups over from the one before where it can), part by
    part."""

    def __init__(self, store: RunStore, threads: int) -> None:
        self._store = store
        self._threads = threads
        self._carry = CopyCarry()
        self._previous: PreviousCopy | None = None

    def make(self) -> Timings:
        """Copy the file, rebuild its derived tables and publish it; each part's seconds."""
        timings: Timings = {}
        temporary = live_copy_draft_path(self._store.path)
        started = time.perf_counter()
        self._store.copy_file(temporary)
        timings[f"{WORKER}copy"] = time.perf_counter() - started
        with RunStore.open_copy(temporary) as copy:
            copy.limit_threads(self._threads)
            copy.limit_memory(INGEST_MEMORY_LIMIT)
            for name, step in copy.rebuild_steps(self._carry, self._previous):
                started = time.perf_counter()
                step()
                timings[f"{WORKER}{name}"] = time.perf_counter() - started
        path = live_copy_path(self._store.path)
        temporary.replace(path)
        assert self._carry.marks is not None
        self._previous = PreviousCopy(path, self._carry.marks)
        return timings

    @property
    def carried(self) -> bool:
        """Whether the last copy carried its tables over from the one before."""
        return self._carry.carried


def measure(
    run: Path, held: list[Event], batches: int, threads: int
) -> tuple[float, dict[str, list[Timings]]]:
    """The time to resume a copy of `run` (with its cache mirrors); its first refresh, then
    per round: one with nothing new, one with the next batch of held-back records, and one with
    the batch after it that rebuilds the tables derived whole as well; DuckDB on `threads`
    threads, as `kvscope collect --threads` sets it."""
    work = run.with_name("live-refresh-work.duckdb")
    shutil.copyfile(run, work)
    size = len(held) // (2 * batches)
    new_batches = iter(held[start : start + size] for start in range(0, len(held), size))
    started = time.perf_counter()
    store = RunStore.resume(work)
    resume_s = time.perf_counter() - started
    store.limit_threads(threads)
    store.checkpoint_only_when_asked()
    copies = TimedCopies(store, threads)
    rounds = {"first refresh": [timed_refresh(store, [], copies)]}
    for _ in range(batches):
        rounds.setdefault("nothing new", []).append(timed_refresh(store, [], None))
        new = timed_refresh(store, next(new_batches), None)
        rounds.setdefault(f"{size:,} new", []).append(new)
        copied = timed_refresh(store, next(new_batches), copies)
        rounds.setdefault(f"{size:,} new, copy", []).append(copied)
    store.close()
    work.unlink()
    live_copy_path(work).unlink()
    return resume_s, rounds


def report(title: str, rounds: dict[str, list[Timings]]) -> None:
    """Print each part's median seconds per kind of refresh, and the refresh's total."""
    medians = {
        column: {part: statistics.median(values) for part, values in _by_part(timings).items()}
        for column, timings in rounds.items()
    }
    print(f"\n{title}")
    print(f"  {'part':<34}" + "".join(f" {column:>20}" for column in medians))
    for part in medians["first refresh"]:
        cells = (f"{row[part]:.3f}" if part in row else "-" for row in medians.values())
        print(f"  {part:<34}" + "".join(f" {cell:>20}" for cell in cells))
    for side, in_side in (("writer", False), ("live copy", True)):
        totals = [
            statistics.median(
                sum(seconds for part, seconds in one.items() if part.startswith(WORKER) == in_side)
                for one in runs
            )
            for runs in rounds.values()
        ]
        print(f"  {side + ' total':<34}" + "".join(f" {total:20.3f}" for total in totals))


def _by_part(rounds: list[Timings]) -> dict[str, list[float]]:
    return {part: [timings[part] for timings in rounds] for part in rounds[0]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--copies", default="10,100", help="run sizes, in sample workloads")
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--batch-records", type=int, default=5_000)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/kvscope-bench"))
    parser.add_argument(
        "--threads",
        type=int,
        default=INGEST_THREADS,
        help=f"DuckDB threads (default {INGEST_THREADS}, what kvscope collect uses)",
    )
    args = parser.parse_args()
    for copies in (int(text) for text in args.copies.split(",")):
        run, held = build_run(args.cache, copies, 2 * args.batches * args.batch_records)
        with RunFile.open(run) as run_file:
            num_rows = run_summary(run_file)["events"]
        resume_s, rounds = measure(run, held, args.batches, args.threads)
        title = (
            f"{run.name}: {num_rows:,} rows (events, pool, collisions); seconds per part, "
            f"median of {args.batches} rounds; DuckDB on {args.threads} thread(s)"
        )
        report(title, rounds)
        print(f"  resuming the run (its cache mirrors from the rows): {resume_s:.3f} s")


if __name__ == "__main__":
    main()
