"""What-if sweeps: the same requests replayed through vLLM's real manager at other settings.

Each point of the sweep (block size x pool size x max running requests x CPU tier x fleet)
is a full replay into its own run file, so the app and `kvscope summary` read it like any
run; the points run in parallel processes (each loads the requests once), or as tasks on a
Ray cluster (collector/replay/ray_sweep.py). `whatif.json` beside the run files lists every
point's figures.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from itertools import product
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from collector.model.block_stream import num_kv_tokens
from collector.model.kv_memory import KVSpec, gib_for_blocks
from collector.replay.replayer import ReplayOptions, replay_requests
from collector.replay.traces import TraceError, TraceRequest, read_trace
from collector.store.run_file import RunStore, StoreError

RESULTS_FILE = "whatif.json"


@dataclass(frozen=True)
class SweepPoint:
    """One configuration of a sweep."""

    block_size: int
    num_blocks: int
    max_num_seqs: int
    cpu_tier_blocks: int = 0
    cpu_tier_policy: str = "lru"
    engines: int = 1  # a fleet of this many engines behind `router`
    router: str = "round-robin"

    @property
    def run_name(self) -> str:
        tier = f"-tier{self.cpu_tier_blocks}{self.cpu_tier_policy}" * (self.cpu_tier_blocks > 0)
        fleet = f"-engines{self.engines}-{self.router}" * (self.engines > 1)
        return (
            f"bs{self.block_size}-blocks{self.num_blocks}-seqs{self.max_num_seqs}{tier}{fleet}"
            ".duckdb"
        )


@dataclass(frozen=True)
class Source:
    """Where the requests come from: a trace, or a run file's recorded requests."""

    path: Path
    trace_format: str = "auto"
    limit: int | None = None

    @property
    def is_run(self) -> bool:
        return self.path.suffix == ".duckdb"

    def load(self) -> list[TraceRequest]:
        if self.is_run:
            from collector.queries.requests import requests_from_run

            store = RunStore.open(self.path)
            try:
                requests = requests_from_run(store, self.path)
            finally:
                store.close()
        else:
            requests = read_trace(self.path, self.trace_format)
        return requests[: self.limit] if self.limit else requests


def sweep_points(
    block_sizes: Iterable[int],
    max_num_seqs: Iterable[int],
    *,
    num_blocks: Iterable[int] = (),
    kv_gib: Iterable[float] = (),
    spec: KVSpec | None = None,
    tiers: Iterable[tuple[int, str]] = ((0, "lru"),),
    fleets: Iterable[tuple[int, str]] = ((1, "round-robin"),),
) -> list[SweepPoint]:
    """Every combination; pool sizes given as blocks, or as GiB of KV cache (per block size,
    through the model's KV spec, so every block size gets the same memory); CPU tiers as
    (blocks, policy), (0, ...) for none; fleets as (engines, router), (1, ...) for one
    engine."""
    from collector.model.kv_memory import blocks_for_gib

    points = []
    tier_choices = sorted({(blocks, policy if blocks else "lru") for blocks, policy in tiers})
    fleet_choices = sorted(
        {(engines, router if engines > 1 else "round-robin") for engines, router in fleets}
    )
    for block_size, seqs in product(block_sizes, max_num_seqs):
        sizes = list(num_blocks)
        if spec is not None:
            sizes += [blocks_for_gib(spec, block_size, gib) for gib in kv_gib]
        points += [
            SweepPoint(block_size, size, seqs, *tier, *fleet)
            for size in sorted(set(sizes))
            for tier in tier_choices
            for fleet in fleet_choices
        ]
    return points


def check_points_fit(requests: list[TraceRequest], points: list[SweepPoint], source: Path) -> None:
    """Refuse a pool that the largest request could never fit in, before any replay starts."""
    largest = max(
        requests,
        key=lambda request: num_kv_tokens(request.num_prompt_tokens, request.output_length),
    )
    tokens = num_kv_tokens(largest.num_prompt_tokens, largest.output_length)
    for point in points:
        needed = -(-tokens // point.block_size) + 1
        if point.num_blocks < needed:
            raise TraceError(
                source,
                largest.line,
                f"request {largest.request_id} needs {needed} blocks of {point.block_size} "
                f"tokens (null block included); the sweep point with {point.num_blocks} "
                "blocks is too small",
            )


_worker_requests: list[TraceRequest] = []


def _load_requests(source: Source) -> None:
    global _worker_requests  # noqa: PLW0603 - one load per worker process
    _worker_requests = source.load()


def replay_point(
    requests: list[TraceRequest],
    point: SweepPoint,
    options: ReplayOptions,
    *,
    out_path: Path,
    source: Path,
    secret: bytes,
) -> dict[str, Any]:
    """Replay one point into `out_path`; its figures, as `whatif.json` lists them."""
    started = time.perf_counter()
    summary: Mapping[str, Any] = replay_requests(requests, source, out_path, options, secret)
    return {
        **asdict(point),
        "dp_size": options.dp_size,
        "seconds": round(time.perf_counter() - started, 2),
        "run": out_path.name,
        **{name: summary[name] for name in _FIGURES},
    }


def _replay_in_worker(
    point: SweepPoint, options: ReplayOptions, out_path: Path, source: Path, secret: bytes
) -> dict[str, Any]:
    return replay_point(
        _worker_requests, point, options, out_path=out_path, source=source, secret=secret
    )


_FIGURES = (
    "token_hit_ratio",
    "block_hit_ratio",
    "hit_tokens",
    "prompt_tokens",
    "evictions",
    "preemptions",
    "requests",
    "tier_hit_tokens",
    "tier_token_hit_ratio",
)


def run_sweep(
    source: Source,
    points: list[SweepPoint],
    out_dir: Path,
    base: ReplayOptions,
    *,
    secret: bytes,
    jobs: int,
    progress: Callable[[int], None] = lambda _: None,
    ray_address: str | None = None,
) -> list[dict[str, Any]]:
    """Replay every point into `out_dir`, `jobs` at a time in local processes, or as tasks on
    the Ray cluster at `ray_address` ("": wherever `ray.init()` finds one); return each
    point's figures, the same either way.

    On any failure the run files this sweep wrote are removed again.
    """
    requests = source.load()
    check_points_fit(requests, points, source.path)
    # Every point's options first: a point ReplayOptions refuses stops the sweep before any replay.
    planned = [(point, _options(base, point), out_dir / point.run_name) for point in points]
    for _, _, path in planned:
        if path.exists():
            raise StoreError(f"{path}: already exists; kvscope does not overwrite runs")
    with ExitStack() as stack:
        if ray_address is None:
            replayed = _replay_in_processes(source, planned, secret, jobs)
        else:
            from collector.replay.ray_sweep import ray_session, replay_on_ray

            stack.enter_context(ray_session(ray_address))  # before anything is written
            replayed = replay_on_ray(requests, planned, source.path, secret)
        out_dir.mkdir(parents=True, exist_ok=True)
        results: list[dict[str, Any]] = []
        try:
            for row in replayed:
                results.append(row)
                progress(1)
        except BaseException:
            replayed.close()  # waits for the pool, or cancels the tasks: nothing writes after
            for _, _, path in planned:
                path.unlink(missing_ok=True)
            raise
    results.sort(
        key=lambda row: (
            row["block_size"],
            row["max_num_seqs"],
            row["num_blocks"],
            row["cpu_tier_blocks"],
            row["cpu_tier_policy"],
            row["engines"],
            row["router"],
        )
    )
    return results


def _replay_in_processes(
    source: Source,
    planned: list[tuple[SweepPoint, ReplayOptions, Path]],
    secret: bytes,
    jobs: int,
) -> Generator[dict[str, Any], None, None]:
    # spawn: vLLM, torch and DuckDB start clean in each worker
    with ProcessPoolExecutor(
        max_workers=max(1, min(jobs, len(planned))),
        mp_context=get_context("spawn"),
        initializer=_load_requests,
        initargs=(source,),
    ) as pool:
        futures = [
            pool.submit(_replay_in_worker, point, options, path, source.path, secret)
            for point, options, path in planned
        ]
        for future in as_completed(futures):
            yield future.result()


def _options(base: ReplayOptions, point: SweepPoint) -> ReplayOptions:
    settings = replace(base.settings, block_size=point.block_size, num_blocks=point.num_blocks)
    return replace(
        base,
        settings=settings,
        max_num_seqs=point.max_num_seqs,
        limit=None,
        cpu_tier_blocks=point.cpu_tier_blocks,
        cpu_tier_policy=point.cpu_tier_policy,
        engines=point.engines,
        router=point.router,
    )


def write_results(
    out_dir: Path, source: Source, base: ReplayOptions, spec: KVSpec, results: list[dict[str, Any]]
) -> Path:
    """`whatif.json`: the source, the replay options, the KV spec and every point's figures
    (with the GiB of KV cache each pool takes under that spec); written atomically."""
    for row in results:
        row["kv_gib"] = round(gib_for_blocks(spec, row["block_size"], row["num_blocks"]), 3)
    document = {
        "source": str(source.path),
        "timing": base.timing,
        "hash_algo": base.settings.hash_algo,
        "kv_layout": base.settings.kv_layout,
        "kv_spec": spec.to_dict(),
        "results": results,
    }
    path = out_dir / RESULTS_FILE
    temporary = out_dir / f".{RESULTS_FILE}.tmp-{os.getpid()}"
    temporary.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    temporary.replace(path)
    return path


def read_results(out_dir: Path) -> dict[str, Any]:
    """A sweep's `whatif.json`."""
    path = out_dir / RESULTS_FILE
    try:
        document: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise TraceError(path, 0, f"not a kvscope what-if result: {error}") from error
    return document
