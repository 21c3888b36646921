"""`kvscope whatif`: replay a trace or a run at other settings, in parallel, into run files."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from collector.commands.kv_options import add_kv_options, gpu_from, kv_spec_from
from collector.commands.number_list import number_list
from collector.commands.replay import timed
from collector.commands.replay_options import (
    add_format_option,
    add_layout_option,
    add_tier_options,
)
from collector.model.kv_memory import gib_for_blocks, vllm_pool_settings
from collector.replay.block_manager import HASH_ALGOS, CacheSettings, require_vllm
from collector.replay.fleet import ROUTERS
from collector.replay.ray_sweep import require_ray
from collector.replay.replayer import TIMINGS, ReplayOptions
from collector.replay.scheduler_replay import DEFAULT_MAX_NUM_BATCHED_TOKENS
from collector.replay.whatif import Source, run_sweep, sweep_document, sweep_points, write_results
from collector.store.run_file import RunFile
from engine_hooks.privacy import load_secret

if TYPE_CHECKING:
    from collector.model.kv_memory import GpuMemory, KVSpec
    from collector.replay.replayer import ReplayOptions
    from collector.replay.sweep_results import SweepResult
    from collector.replay.whatif import RunDefaults


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "whatif",
        help="replay a trace or a run at other block sizes / pool sizes / concurrency",
    )
    parser.add_argument(
        "source", type=Path, help="trace (.jsonl[.gz]), run file (.duckdb) or Parquet dataset"
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for the run files")
    _add_axes(parser)
    parser.add_argument(
        "--timing", choices=TIMINGS, help="default: the run's replay timing, else scheduler"
    )
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        help=f"tokens a step schedules at most (scheduler timing; default: the run's, else "
        f"{DEFAULT_MAX_NUM_BATCHED_TOKENS})",
    )
    parser.add_argument("--hash-algo", choices=HASH_ALGOS, help="default: the run's, else sha256")
    add_layout_option(parser, default=None)
    add_format_option(parser)
    parser.add_argument("--limit", type=int, help="replay only the first N requests")
    _add_where_and_fleets(parser)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_tier_options(parser, many=True)
    add_kv_options(parser)
    parser.set_defaults(handler=_run_whatif)


def _add_axes(parser: argparse.ArgumentParser) -> None:
    """The sweep's block sizes, pool sizes and concurrencies."""
    parser.add_argument(
        "--block-size", type=lambda text: number_list(int, text), help="e.g. 16,32,64"
    )
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument(
        "--num-blocks", type=lambda text: number_list(int, text), help="pool sizes, e.g. 2000,4000"
    )
    sizes.add_argument(
        "--kv-gib",
        type=lambda text: number_list(float, text),
        help="pool sizes as GiB of KV cache per GPU (same memory for every block size)",
    )
    parser.add_argument(
        "--max-num-seqs",
        type=lambda text: number_list(int, text),
        help="running requests at most, a comma-separated list (default: the run's)",
    )


def _add_where_and_fleets(parser: argparse.ArgumentParser) -> None:
    """Where the points replay (local processes or a Ray cluster), and the fleets axis."""
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="parallel replays (local processes)"
    )
    parser.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="run each point as a task on a Ray cluster: the one at ADDRESS, or without one "
        "wherever ray.init() finds it (RAY_ADDRESS, a cluster started on this machine, else a "
        "new local instance); needs `pip install 'kvscope[ray]'`",
    )
    parser.add_argument(
        "--engines",
        type=lambda text: number_list(int, text),
        help="fleets of this many engines, each with a pool of --num-blocks, a comma-separated "
        "list (default: the run's, else 1); above 1 they take --timing sequential or scheduler",
    )
    parser.add_argument(
        "--routers",
        type=_routers,
        help=f"how the fleets route, a comma-separated list among {', '.join(ROUTERS)} "
        "(default: the run's, else round-robin)",
    )


def _routers(text: str) -> list[str]:
    values = [item.strip() for item in text.split(",") if item.strip()]
    if not values or any(value not in ROUTERS for value in values):
        raise argparse.ArgumentTypeError(
            f"expected routers among {', '.join(ROUTERS)}, got {text!r}"
        )
    return values


def _run_whatif(args: argparse.Namespace) -> int:
    source = Source(args.source, args.trace_format, args.limit)
    if source.is_run:  # a damaged run is refused first, whether or not vLLM is here
        RunFile.open(source.path).close()
    require_vllm()  # before any work: a clear refusal, not a traceback in a worker
    if args.ray is not None:
        require_ray()
    defaults = source.defaults()
    base = _base_options(args, defaults)
    spec = kv_spec_from(args)
    points = sweep_points(
        args.block_size or [defaults.block_size],
        args.max_num_seqs or [defaults.max_num_seqs],
        num_blocks=args.num_blocks or ([] if args.kv_gib else [defaults.num_blocks]),
        kv_gib=args.kv_gib or [],
        spec=spec,
        tiers=[
            (blocks, policy) for blocks in args.cpu_tier_blocks for policy in args.cpu_tier_policy
        ],
        fleets=[
            (engines, router)
            for engines in args.engines or [defaults.engines]
            for router in args.routers or [defaults.router]
        ],
    )
    # The bar counts requests replayed, every point's: it moves within a point.
    bar = tqdm(unit="req", desc="starting vLLM", disable=True if args.quiet else None)
    with bar:
        figures = run_sweep(
            source,
            points,
            args.out,
            base,
            secret=load_secret(),
            jobs=args.jobs,
            progress=timed(bar),
            total=lambda requests: bar.reset(total=requests),
            ray_address=args.ray,
        )
    sweep = sweep_document(source, base, spec, figures)
    path = write_results(args.out, sweep)
    if args.json:
        print(json.dumps([result.to_json() for result in sweep.results], sort_keys=True))
    else:
        _print_table(sweep.results, spec, gpu_from(args), defaults, args.max_model_len)
        print(f"\n{len(sweep.results)} runs in {args.out}; figures in {path}")
    return 0


def _base_options(args: argparse.Namespace, defaults: RunDefaults) -> ReplayOptions:
    """Replay options from the flags, defaulting to the source's (`Source.defaults`)."""
    return ReplayOptions(
        settings=CacheSettings(
            defaults.block_size,
            defaults.num_blocks,
            args.hash_algo or defaults.hash_algo,
            args.kv_layout or defaults.kv_layout,
        ),
        timing=args.timing or defaults.timing,
        max_num_batched_tokens=args.max_num_batched_tokens or defaults.max_num_batched_tokens,
        step_model=defaults.step_model,
        reveal_tenants=defaults.reveal_tenants,
        dp_size=defaults.dp_size,
    )


def _print_table(
    results: list[SweepResult],
    spec: KVSpec,
    gpu: GpuMemory | None,
    defaults: RunDefaults,
    max_model_len: int | None,
) -> None:
    current_gib = gib_for_blocks(spec, defaults.block_size, defaults.num_blocks)
    fleets = any(row.num_pools > 1 for row in results)
    print(f"KV memory for {spec.describe()}")
    print(
        f"{'block':>5} {'blocks':>8} {'GiB':>7} {'seqs':>5} {'token hit':>9} {'block hit':>9} "
        f"{'evictions':>10} {'preempt':>7} {'CPU tier':>12} {'tier hit':>8}  "
        + f"{'fleet':<20} " * fleets
        + "settings"
    )
    for row in results:
        settings = [
            f"--block-size {row.block_size}",
            *vllm_pool_settings(
                spec,
                row.block_size,
                row.num_blocks,
                current_gib,
                gpu,
                max_model_len=max_model_len,
            ),
        ]
        print(
            f"{row.block_size:>5} {row.num_blocks:>8,} {row.kv_gib:>7.2f} "
            f"{row.max_num_seqs:>5} {row.token_hit_ratio:>9.2%} "
            f"{row.block_hit_ratio:>9.2%} {row.evictions:>10,} {row.preemptions:>7,} "
            f"{_tier(row):>12} {row.tier_token_hit_ratio:>8.2%}  "
            + f"{_fleet(row):<20} " * fleets
            + " ".join(settings)
        )
    _print_memory_steps(results)
    _print_router_gains(results)


def _tier(row: SweepResult) -> str:
    blocks = row.cpu_tier_blocks
    return f"{blocks:,} {row.cpu_tier_policy}" if blocks else "none"


def _fleet(row: SweepResult) -> str:
    if row.num_pools == 1:
        return "one engine"
    ranks = f" x {row.dp_size} DP" * (row.dp_size > 1)
    return f"{row.engines}{ranks} x {row.router}"


def _print_memory_steps(results: list[SweepResult]) -> None:
    """For each block size, concurrency, CPU tier and fleet: what each step up in memory
    buys."""
    previous: dict[tuple[int, int, str, str], SweepResult] = {}
    lines = []
    for row in results:
        key = (row.block_size, row.max_num_seqs, _tier(row), _fleet(row))
        if key in previous:
            before = previous[key]
            fleet = f" ({_fleet(row)})" * (row.num_pools > 1)
            lines.append(
                f"block size {row.block_size}{fleet}: "
                f"{row.kv_gib - before.kv_gib:+.2f} GiB of "
                f"KV cache ({before.num_blocks:,} -> {row.num_blocks:,} blocks) -> "
                f"{(row.token_hit_ratio - before.token_hit_ratio) * 100:+.1f} points of "
                "token hit ratio"
            )
        previous[key] = row
    if lines:
        print()
        print("\n".join(lines))


def _print_router_gains(results: list[SweepResult]) -> None:
    """For each fleet: what each router gains over round-robin at the same settings."""
    round_robin = {
        _fleet_settings(row): row
        for row in results
        if row.engines > 1 and row.router == "round-robin"
    }
    lines = []
    for row in results:
        baseline = round_robin.get(_fleet_settings(row))
        if row.engines > 1 and row.router != "round-robin" and baseline:
            gain = (row.token_hit_ratio - baseline.token_hit_ratio) * 100
            lines.append(
                f"{row.engines} engines of {row.num_blocks:,} blocks of "
                f"{row.block_size}: {row.router} {gain:+.1f} points of token hit ratio "
                "over round-robin"
            )
    if lines:
        print()
        print("\n".join(lines))


def _fleet_settings(row: SweepResult) -> tuple[int, int, int, int]:
    return row.block_size, row.num_blocks, row.max_num_seqs, row.engines
