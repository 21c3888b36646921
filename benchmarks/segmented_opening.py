"""What opening a segmented run costs, with and without the cache lifetimes its segments
derived when they closed (collector/store/segment_lifetimes.py), at two run sizes.

For each --requests size, the sample trace's first requests go through vLLM's own KV cache
manager on four engines (a 120-block pool, so blocks are evicted and reused), their
records interleaved, into two segmented runs closed every --segment-rows rows, as
`kvscope collect --segment-rows` closes them: one whose segments derive their lifetimes
when they close, one closed as before (no derived files: its reader derives the lifetimes
from every row when it opens the run), and the same records in one run file. Built under a
temporary folder each time (a minute or two) and never kept.

Prints, per size: the event rows and segments, the median segment close (the collector's,
the derivation included or not), and the median of --rounds openings, the three runs in
turn each round (`RunFile.open`, which derives the run's derived tables: `requests`, the
rollups, the lifetimes, the lookups' causes), side by side, with the ratio.

    python benchmarks/segmented_opening.py [--requests 150,600] [--segment-rows 20000]
        [--rounds 5]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.support

from collector.replay.block_manager import CacheSettings
from collector.store.run_file import RunConfig, RunFile, RunStore
from collector.store.segments import SegmentPolicy, Segments
from tests.support.block_manager import sample_engine_steps

SETTINGS = CacheSettings(block_size=16, num_blocks=120)
ENGINES = ("a", "b", "c", "d")


class ClosedAsBefore(Segments):
    """Segments closed as a kvscope before derived files closed them."""

    def _derive(self, number: int, temporary: Path, stem: str) -> None:
        return


def build(path: Path, requests: int, segment_rows: int | None, derived: bool) -> list[float]:
    """A run of the sample's first `requests` on each engine at `path` (segmented every
    `segment_rows` rows, its segments `derived` or not); the seconds of each close."""
    config = RunConfig("benchmark", SETTINGS.block_size, SETTINGS.num_blocks, "sha256", "b")
    store = RunStore.create(path, config)
    kind = Segments if derived else ClosedAsBefore
    policy = SegmentPolicy(rows=segment_rows)
    segments = None if segment_rows is None else kind(store, policy, log=lambda _: None)
    steps = [sample_engine_steps(SETTINGS, requests, engine) for engine in ENGINES]
    closes: list[float] = []
    for number, records in enumerate(
        step for group in itertools.zip_longest(*steps) for step in group if step
    ):
        store.append(records)
        if number % 50 == 0 and segments is not None:
            store.flush()
            if segments.due():
                started = time.perf_counter()
                segments.close()
                closes.append(time.perf_counter() - started)
    store.finalize()
    store.close()
    return closes


def opening(paths: list[Path], rounds: int) -> list[tuple[float, int]]:
    """The median seconds of opening each run of `paths`, in turn round after round (so a
    busy machine slows each alike), and its event rows."""
    seconds: list[list[float]] = [[] for _ in paths]
    rows = [0 for _ in paths]
    for _ in range(rounds):
        for index, path in enumerate(paths):
            started = time.perf_counter()
            with RunFile.open(path) as run:
                seconds[index].append(time.perf_counter() - started)
                row = run.row("SELECT count(*) FROM events")
                rows[index] = int(row[0]) if row else 0
    return [(statistics.median(times), count) for times, count in zip(seconds, rows, strict=True)]


def measure(requests: int, segment_rows: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="kvscope-segmented-") as folder:
        runs = {
            "one run file": (Path(folder) / "one.duckdb", None, False),
            "segments closed as before": (Path(folder) / "before.duckdb", segment_rows, False),
            "segments with derived lifetimes": (Path(folder) / "after.duckdb", segment_rows, True),
        }
        closes = {name: build(path, requests, rows, derived)
                  for name, (path, rows, derived) in runs.items()}  # fmt: skip
        openings = opening([path for path, _, _ in runs.values()], rounds)
        results = {
            name: (closes[name], *opened) for name, opened in zip(runs, openings, strict=True)
        }
        before = results["segments closed as before"][1]
        print(f"\n{requests} requests on each of {len(ENGINES)} engines:")
        for name, (closes, seconds, rows) in results.items():
            closing = f"close {statistics.median(closes):.3f} s" if closes else "no segments"
            print(
                f"  {name:33} {rows:>9,} event rows, {len(closes):>3} segments, {closing:>16};"
                f" opening {seconds:.3f} s ({seconds / before:.2f} x before)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", default="150,600", help="requests per engine, per size")
    parser.add_argument("--segment-rows", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    for requests in (int(size) for size in options.requests.split(",")):
        measure(requests, options.segment_rows, options.rounds)


if __name__ == "__main__":
    main()
