"""`kvscope advise` on a run, as a user meets it: its first output and its whole, the first
time the run is advised (nothing kept: every replay through vLLM runs), with the replays kept
in the cache folder but no advice in the run file (a run file advise could not write), and
with the advice kept in the run file (collector/advisor/stored.py), side by side in one run.

Each round copies the run into a folder of its own (the run given is never written) and runs
`kvscope advise COPY --json` in a new process three times:

- cold: an empty cache folder and a copy without advice (what every advise cost before any
  was kept); it keeps its advice in the copy;
- replays: a fresh copy of the run (no advice in it) with the cache folder cold filled:
  the rules run again on the replays read back (what every second advise cost before the
  advice was kept in the run file); with --no-store, so the copy stays without advice;
- stored: the copy cold wrote its advice into, read back.

Times are wall-clock from the process's start: to the first line on stderr (the progress),
and to its exit. The JSON printed must be the same, byte for byte, in all three, in every
round. Prints each run's times, the medians and the ratios.

    python benchmarks/advise_speed.py [--run sample_data/run.duckdb] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def advise(run: Path, cache: Path, *extra: str) -> tuple[float, float, str]:
    """Seconds to the first line on stderr and to the exit of one `kvscope advise --json`,
    and what it printed on stdout."""
    env = {**os.environ, "KVSCOPE_CACHE_DIR": str(cache)}
    command = [sys.executable, "-m", "collector.cli", "advise", str(run), "--json", *extra]
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
    kinds = ("cold", "replays", "stored")
    times: dict[str, list[tuple[float, float]]] = {kind: [] for kind in kinds}
    for round_number in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="kvscope-advise-speed-") as folder:
            cache, advised, fresh = (Path(folder) / name for name in ("cache", "a", "b"))
            for copy in (advised, fresh):
                copy.mkdir()
                shutil.copyfile(args.run, copy / args.run.name)
            runs = {
                "cold": (advised / args.run.name,),
                "replays": (fresh / args.run.name, "--no-store"),
                "stored": (advised / args.run.name,),
            }
            outputs = {}
            for kind in kinds:  # in this order: each reads what the one before kept
                first, whole, output = advise(runs[kind][0], cache, *runs[kind][1:])
                times[kind].append((first, whole))
                outputs[kind] = output.replace(str(runs[kind][0]), "RUN")
                print(
                    f"round {round_number + 1} {kind}: first output {first:5.2f} s, "
                    f"whole {whole:6.2f} s"
                )
            if len(set(outputs.values())) != 1:
                raise SystemExit("the advice differs between the cold, replays and stored runs")
    print(f"\n{args.run.name}, {args.rounds} rounds; the advice identical in all three")
    print(f"{'':8} {'first output':>14} {'whole':>10}")
    medians = {}
    for kind, measured in times.items():
        first = statistics.median(run[0] for run in measured)
        whole = statistics.median(run[1] for run in measured)
        medians[kind] = whole
        print(f"{kind:8} {first:12.2f} s {whole:8.2f} s")
    for kind in kinds[1:]:
        print(f"ratio cold / {kind} (whole): {medians['cold'] / medians[kind]:.1f}x")


if __name__ == "__main__":
    main()
