"""`kvscope advise` on a run, as a user meets it: its first output and its whole, the first
time the run is advised (the advisor's replay cache empty: every replay through vLLM runs)
and again (the replays read back from the cache), side by side in one run.

Each round runs `kvscope advise RUN --json` in a new process, once with an empty cache folder
(cold: what every advise cost before the cache, plus writing its few small files) and once
more with the folder it filled (warm).
Times are wall-clock from the process's start: to the first line on stderr (the progress),
and to its exit. The JSON printed must be the same, byte for byte, cold and warm, in every
round. Prints each run's times, the medians and the ratio cold / warm.

    python benchmarks/advise_speed.py [--run sample_data/run.duckdb] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def advise(run: Path, cache: Path) -> tuple[float, float, str]:
    """Seconds to the first line on stderr and to the exit of one `kvscope advise --json`,
    and what it printed on stdout."""
    env = {**os.environ, "KVSCOPE_CACHE_DIR": str(cache)}
    command = [sys.executable, "-m", "collector.cli", "advise", str(run), "--json"]
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.PIPE, text=True
        )
        assert process.stderr is not None
        first = process.stderr.readline()
        first_output = time.perf_counter() - started
        rest = process.stderr.read()
        if process.wait() != 0:
            raise SystemExit(f"kvscope advise failed:\n{first}{rest}")
        whole = time.perf_counter() - started
        out.seek(0)
        return first_output, whole, out.read()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=ROOT / "sample_data" / "run.duckdb")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    times: dict[str, list[tuple[float, float]]] = {"cold": [], "warm": []}
    for round_number in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="kvscope-advise-speed-") as folder:
            cache = Path(folder)
            outputs = {}
            # Cold comes first within a round: it fills the cache the warm run reads.
            for kind in ("cold", "warm"):
                first, whole, output = advise(args.run, cache)
                times[kind].append((first, whole))
                outputs[kind] = output
                print(
                    f"round {round_number + 1} {kind}: first output {first:5.2f} s, "
                    f"whole {whole:6.2f} s"
                )
            if outputs["cold"] != outputs["warm"]:
                raise SystemExit("the advice differs between the cold and the warm run")
    print(f"\n{args.run.name}, {args.rounds} rounds; the advice identical cold and warm")
    print(f"{'':6} {'first output':>14} {'whole':>10}")
    medians = {}
    for kind, runs in times.items():
        first = statistics.median(run[0] for run in runs)
        whole = statistics.median(run[1] for run in runs)
        medians[kind] = whole
        print(f"{kind:6} {first:12.2f} s {whole:8.2f} s")
    print(f"ratio cold / warm (whole): {medians['cold'] / medians['warm']:.1f}x")


if __name__ == "__main__":
    main()
