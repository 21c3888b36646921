"""Every app page's queries on a generated run of more than 10 million events, timed.

The run: the sample workload (`kvscope generate`: three tenants, chats, RAG, a LoRA adapter,
a report burst) drawn 100 times with different seeds and laid end to end on the clock, then
replayed through vLLM's real KV cache manager (timestamps timing, block size 16, 2,400
blocks, at most 32 running requests, token ids recorded): about 50,000 requests and 11
million records. It is built once (a few minutes) under --cache (default /tmp/kvscope-bench),
named after the run-file layout (schema version and DDL), and never committed.

For each page the script makes the collector calls the page makes, with its default
settings, over the whole run and over its middle 80 % (a window that is not the whole run
reads raw events where a rollup has no time axis), and prints each call's time and each
page's total: the coldest of --rounds rounds and their median.

    python benchmarks/app_queries.py [--copies 100] [--rounds 3] [--cache DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from collector.model import comparison, cost
from collector.model.time_window import TimeWindow
from collector.queries import activity, collisions, hotspots, prefix_tree, roi, tenants
from collector.queries.config import run_config
from collector.queries.pool import free_block_extremes, low_free_periods, pool_timeline
from collector.queries.summary import run_summary
from collector.queries.timeline import time_grid
from collector.replay.block_manager import CacheSettings
from collector.replay.replayer import ReplayOptions, replay
from collector.replay.workload import WorkloadShape, generate, write_trace
from collector.store.run_file import RunFile, RunStore
from collector.store.schema import CREATE_STATEMENTS, DERIVED_STATEMENTS, SCHEMA_VERSION

SECRET = b"kvscope-benchmark"
OPTIONS = ReplayOptions(
    settings=CacheSettings(block_size=16, num_blocks=2_400),
    timing="timestamps",
    max_num_seqs=32,
    record_token_ids=True,
    reveal_tenants=True,
)
Call = Callable[[], Any]


def build_run(cache: Path, copies: int) -> Path:
    """The generated run, replayed once and then reused while the run-file layout holds."""
    layout = hashlib.sha256("".join(CREATE_STATEMENTS + DERIVED_STATEMENTS).encode()).hexdigest()
    run = cache / f"app-queries-schema{SCHEMA_VERSION}-{layout[:8]}-{copies}x.duckdb"
    if run.exists():
        return run
    trace = workload_trace(cache, copies)
    print(f"replaying {trace} into {run} (once; a few minutes)", flush=True)
    started = time.perf_counter()
    replay(trace, run, OPTIONS, SECRET)
    print(f"replayed in {time.perf_counter() - started:.0f} s", flush=True)
    return run


def workload_trace(cache: Path, copies: int) -> Path:
    """The sample workload drawn `copies` times with different seeds, laid end to end on the
    clock, as a trace under `cache` (written once)."""
    cache.mkdir(parents=True, exist_ok=True)
    trace = cache / f"app-queries-{copies}x.jsonl"
    if not trace.exists():
        rows = []
        for copy in range(copies):
            shape = WorkloadShape(seed=1_000 + copy)
            for row in generate(shape):
                row["request_id"] = f"c{copy}-{row['request_id']}"
                row["timestamp"] = round(row["timestamp"] + copy * shape.duration_s * 1000, 3)
                rows.append(row)
        rows.sort(key=lambda row: (row["timestamp"], row["request_id"]))
        write_trace(rows, trace)
    return trace


def page_calls(store: RunFile, window: TimeWindow, second: RunFile) -> dict[str, dict[str, Call]]:
    """Per page, the collector calls it makes (as in visualizer/views/, default settings)."""
    model = cost.CostModel()
    block_size = 16
    second_window = time_grid(second).window(window.start_s, window.end_s)
    return {
        "sidebar (every page)": {
            "time_grid": lambda: time_grid(store),
            "run_config": lambda: run_config(store),
        },
        "overview": {
            "window_figures": lambda: activity.window_figures(store, window),
            "figures_over_time": lambda: activity.figures_over_time(store, window),
        },
        "hotspots": {
            "block_heatmap": lambda: hotspots.block_heatmap(store, window),
            "hit_count_frequencies": lambda: hotspots.hit_count_frequencies(store, window),
            "top_blocks": lambda: hotspots.top_blocks(store, window, 20),
        },
        "prefix tree": _prefix_tree_calls(store, window),
        "roi": {
            "window_figures": lambda: activity.window_figures(store, window),
            "held_block_seconds": lambda: roi.held_block_seconds(store, window),
            "figures_over_time": lambda: activity.figures_over_time(store, window),
            "tenant_usage": lambda: cost.price_prompts(
                tenants.tenant_usage(store, window), model, block_size
            ),
            "prefix_savings": lambda: cost.price_blocks(
                roi.prefix_savings(store, window, 15), model, block_size
            ),
        },
        "free blocks": {
            "pool_timeline": lambda: pool_timeline(store, window=window),
            "low_free_periods": lambda: low_free_periods(store, 0.10, window),
            "figures_over_time (400)": lambda: activity.figures_over_time(
                store, window, max_points=400
            ),
            "free_block_extremes": lambda: free_block_extremes(store, 0.10, window),
        },
        "collisions": {
            "collision_check": lambda: collisions.collision_check(store, window),
            "figures_over_time": lambda: activity.figures_over_time(store, window),
            "collision_rows": lambda: collisions.collision_rows(store, window),
        },
        "tenants": {
            "tenant_usage": lambda: tenants.tenant_usage(store, window),
            "cross_tenant_hits": lambda: tenants.cross_tenant_hits(store, window),
        },
        "compare": {
            "window_figures x2": lambda: comparison.compare_figures(
                activity.window_figures(store, window),
                activity.window_figures(second, second_window),
            ),
            "figures_over_time x2": lambda: (
                activity.figures_over_time(store, window),
                activity.figures_over_time(second, second_window),
            ),
            "run_config x2": lambda: comparison.compare_settings(
                run_config(store), run_config(second)
            ),
            "time_grid (second run)": lambda: time_grid(second),
        },
    }


def _prefix_tree_calls(store: RunFile, window: TimeWindow) -> dict[str, Call]:
    """The prefix tree page's calls, on a node and the five prefixes it would show (the
    token ids of every block drawn are read once: the nodes' texts and the prefixes')."""
    hot = prefix_tree.tree_nodes(store, window, 1_000)
    node = int(hot["block_hash"].iloc[len(hot) // 2], 16)
    merged = prefix_tree.merge_unbranched(hot)
    served = merged["hits"] * (merged["block_position"] + 1)
    hottest = merged.assign(served=served).nlargest(5, "served")
    return {
        "tree_nodes (1,000)": lambda: prefix_tree.tree_nodes(store, window, 1_000),
        "merge_unbranched": lambda: prefix_tree.merge_unbranched(hot),
        "node_details": lambda: prefix_tree.node_details(store, node, window),
        "has_token_ids": lambda: prefix_tree.has_token_ids(store),
        "token ids (1,000 blocks, 5 prefixes)": lambda: prefix_tree.chain_token_ids(
            prefix_tree.block_token_ids(store, hot["block_hash"]),
            [prefix_tree.chain_to(hot, block) for block in hottest["block_hash"]],
        ),
    }


def timed(call: Call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def measure(calls: dict[str, dict[str, Call]], rounds: int) -> dict[str, dict[str, list[float]]]:
    """Each call's seconds in each round; the rounds go through every page in turn."""
    seconds: dict[str, dict[str, list[float]]] = {
        page: {name: [] for name in named} for page, named in calls.items()
    }
    for _ in range(rounds):
        for page, named in calls.items():
            for name, call in named.items():
                seconds[page][name].append(timed(call))
    return seconds


def report(title: str, seconds: dict[str, dict[str, list[float]]]) -> float:
    """Print a table of calls and page totals; return the slowest page's coldest total."""
    print(f"\n{title}")
    print(f"  {'page / query':<34} {'coldest s':>10} {'median s':>10}")
    slowest = 0.0
    for page, named in seconds.items():
        totals = [sum(values) for values in zip(*named.values(), strict=True)]
        slowest = max(slowest, *totals)
        print(f"  {page:<34} {max(totals):10.3f} {statistics.median(totals):10.3f}")
        for name, values in named.items():
            print(f"    {name:<32} {max(values):10.3f} {statistics.median(values):10.3f}")
    return slowest


def time_pages(
    store: RunFile,
    second: RunFile,
    rounds: int,
    more: Callable[[TimeWindow], dict[str, dict[str, Call]]] = lambda _: {},
) -> None:
    """Time every page's calls (`page_calls`, and `more`'s) over the whole run and over its
    middle 80 %; print them and the slowest page."""
    grid = time_grid(store)
    windows = {
        "whole run": grid.whole_run(),
        "middle 80 %": grid.window(0.1 * grid.span_s, 0.9 * grid.span_s),
    }
    slowest = 0.0
    for label, window in windows.items():
        seconds = measure({**page_calls(store, window, second), **more(window)}, rounds)
        title = (
            f"{label}: {window.start_s:,.0f}-{window.end_s:,.0f} s, {rounds} rounds, "
            "seconds per call and per page"
        )
        slowest = max(slowest, report(title, seconds))
    print(f"\nslowest page, coldest round: {slowest:.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--copies", type=int, default=100, help="sample workloads end to end")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/kvscope-bench"))
    args = parser.parse_args()
    run = build_run(args.cache, args.copies)
    sample = Path(__file__).resolve().parents[1] / "sample_data" / "run_block32.duckdb"
    store, second = RunStore.open(run), RunStore.open(sample)
    summary = run_summary(store)
    tables = {
        name: int((store.row(f"SELECT count(*) FROM {name}") or (0,))[0])
        for name in ("events", "pool", "time_rollup", "block_heat", "prefix_blocks")
    }
    print(
        f"{run}: {summary['events']:,} events ({tables['events']:,} event rows, "
        f"{tables['pool']:,} pool rows), {summary['requests']:,} requests; rollups: "
        f"time_rollup {tables['time_rollup']:,} rows, block_heat {tables['block_heat']:,}, "
        f"prefix_blocks {tables['prefix_blocks']:,}. Compared with {sample.name}."
    )
    time_pages(store, second, args.rounds)
    store.close()
    second.close()


if __name__ == "__main__":
    main()
