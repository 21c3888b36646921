"""What-if sweeps: the same requests replayed through vLLM's real manager at other settings.

Each point of the sweep (block size x pool size x max running requests x CPU tier x fleet)
is a full replay into its own run file, so the app and `kvscope summary` read it like any
run; the points run in parallel processes (each loads the requests once), or as tasks on a
Ray cluster (collector/replay/ray_sweep.py). `whatif.json` beside the run files lists every
point's figures. A point's settings, replay and figures are collector/replay/sweep_point.py's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from itertools import product
from multiprocessing import get_context
from multiprocessing.queues import Queue
from pathlib import Path
from typing import TypeVar

import msgspec

from collector.model.block_stream import num_kv_tokens
from collector.model.kv_memory import KVSpec, blocks_for_gib
from collector.model.step_model import StepModel
from collector.model.trace_request import TraceRequest
from collector.queries.config import RunRow, recorded_options, run_config
from collector.queries.requests import requests_from_run
from collector.replay.ray_sweep import ray_session, replay_on_ray
from collector.replay.replayer import ReplayOptions
from collector.replay.scheduler_replay import DEFAULT_MAX_NUM_BATCHED_TOKENS
from collector.replay.sweep_point import SweepPoint, replay_point
from collector.replay.sweep_progress import (
    REPORT_EVERY_S,
    SweepProgress,
    point_reporter,
    start_reporting,
)
from collector.replay.sweep_results import PointFigures, SweepResult, WhatIfSweep
from collector.replay.traces import TraceError, read_trace
from collector.store.parquet_dataset import is_dataset
from collector.store.run_file import RunStore, StoreError

RESULTS_FILE = "whatif.json"
T = TypeVar("T")


@dataclass(frozen=True)
class Source:
    """Where the requests come from: a trace, or a run's recorded requests."""

    path: Path
    trace_format: str = "auto"
    limit: int | None = None

    @property
    def is_run(self) -> bool:
        """A run file, or a run exported as a Parquet dataset."""
        return self.path.suffix == ".duckdb" or is_dataset(self.path)

    def load(self) -> list[TraceRequest]:
        if self.is_run:
            store = RunStore.open(self.path)
            try:
                requests = requests_from_run(store, self.path)
            finally:
                store.close()
        else:
            requests = read_trace(self.path, self.trace_format, self.limit)
        return requests[: self.limit] if self.limit else requests

    def defaults(self) -> RunDefaults:
        """The settings the source run recorded, as a sweep's defaults; kvscope's for a
        trace."""
        if not self.is_run:
            return RunDefaults()
        store = RunStore.open(self.path)
        try:
            return run_defaults(run_config(store))
        finally:
            store.close()


@dataclass(frozen=True)
class RunDefaults:
    """What a sweep replays at where its flags name nothing: the source run's own settings
    (`run_defaults`), else these."""

    block_size: int = 16
    num_blocks: int = 20_000
    max_num_seqs: int = 256
    timing: str = "scheduler"
    hash_algo: str = "sha256"
    kv_layout: str = "full"
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    engines: int = 1
    router: str = "round-robin"
    dp_size: int = 1
    step_model: StepModel = field(default_factory=StepModel)
    reveal_tenants: bool = False  # a run's tenant labels are already what it chose to store


def run_defaults(config: RunRow) -> RunDefaults:
    """A run's settings as a sweep's defaults: its runs row's where set, the options it
    recorded where given (a live capture records fewer than a replay), kvscope's elsewhere."""
    options = recorded_options(config)
    kvscope = RunDefaults()
    return RunDefaults(
        block_size=_set_or(config["block_size"], kvscope.block_size),
        num_blocks=_set_or(config["num_blocks"], kvscope.num_blocks),
        max_num_seqs=_set_or(config["max_num_seqs"], kvscope.max_num_seqs),
        timing=_set_or(config["timing"], kvscope.timing),
        hash_algo=_set_or(config["hash_algo"], kvscope.hash_algo),
        kv_layout=options.kv_layout or kvscope.kv_layout,
        max_num_batched_tokens=options.max_num_batched_tokens or kvscope.max_num_batched_tokens,
        engines=options.engines or kvscope.engines,
        router=options.router or kvscope.router,
        dp_size=options.dp_size or kvscope.dp_size,
        step_model=options.step_model or kvscope.step_model,
        reveal_tenants=True,
    )


def _set_or(value: T | None, default: T) -> T:
    return default if value is None else value


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


def _start_worker(source: Source, reports: Queue[tuple[str, int]]) -> None:
    global _worker_requests  # noqa: PLW0603 - one load per worker process
    _worker_requests = source.load()
    start_reporting(reports)


def _replay_in_worker(
    point: SweepPoint, options: ReplayOptions, out_path: Path, source: Path, secret: bytes
) -> PointFigures:
    return replay_point(
        _worker_requests,
        point,
        options,
        out_path=out_path,
        source=source,
        secret=secret,
        progress=point_reporter(out_path.name),
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
    total: Callable[[int], None] = lambda _: None,
    ray_address: str | None = None,
) -> list[PointFigures]:
    """Replay every point into `out_dir`, `jobs` at a time in local processes, or as tasks on
    the Ray cluster at `ray_address` ("": wherever `ray.init()` finds one); return each
    point's figures, the same either way. `total` is told the requests the sweep replays
    (every point's), once they are read; `progress` the requests replayed since it was last
    told, as they are (in local processes; a point at once on Ray).

    On any failure the run files this sweep wrote are removed again.
    """
    requests = source.load()
    check_points_fit(requests, points, source.path)
    total(len(requests) * len(points))
    # Every point's options first: a point ReplayOptions refuses stops the sweep before any replay.
    planned = [(point, _options(base, point), out_dir / point.run_name) for point in points]
    for _, _, path in planned:
        if path.exists():
            raise StoreError(f"{path}: already exists; kvscope does not overwrite runs")
    with ExitStack() as stack:
        if ray_address is None:
            replayed = _replay_in_processes(
                source, planned, secret, jobs, SweepProgress(len(requests), progress)
            )
        else:
            stack.enter_context(ray_session(ray_address))  # before anything is written
            replayed = replay_on_ray(requests, planned, source.path, secret)
        out_dir.mkdir(parents=True, exist_ok=True)
        results: list[PointFigures] = []
        try:
            for row in replayed:
                results.append(row)
                if ray_address is not None:
                    progress(len(requests))
        except BaseException:
            replayed.close()  # waits for the pool, or cancels the tasks: nothing writes after
            for _, _, path in planned:
                path.unlink(missing_ok=True)
            raise
    return sorted(results, key=lambda result: result.order)


def _replay_in_processes(
    source: Source,
    planned: list[tuple[SweepPoint, ReplayOptions, Path]],
    secret: bytes,
    jobs: int,
    progress: SweepProgress,
) -> Generator[PointFigures, None, None]:
    context = get_context("spawn")  # vLLM, torch and DuckDB start clean in each worker
    reports: Queue[tuple[str, int]] = context.Queue()
    with ProcessPoolExecutor(
        max_workers=max(1, min(jobs, len(planned))),
        mp_context=context,
        initializer=_start_worker,
        initargs=(source, reports),
    ) as pool:
        pending = {
            pool.submit(_replay_in_worker, point, options, path, source.path, secret)
            for point, options, path in planned
        }
        while pending:
            done, pending = wait(pending, timeout=REPORT_EVERY_S, return_when=FIRST_COMPLETED)
            progress.read(reports)
            for future in done:
                figures = future.result()
                progress.ended_point(reports, figures.run)
                yield figures


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


def sweep_document(
    source: Source, base: ReplayOptions, spec: KVSpec, results: list[PointFigures]
) -> WhatIfSweep:
    """The sweep's source, replay options and KV spec, and every point's figures with the
    GiB of KV cache each pool takes under that spec."""
    return WhatIfSweep(
        source=str(source.path),
        timing=base.timing,
        hash_algo=base.settings.hash_algo,
        kv_layout=base.settings.kv_layout,
        kv_spec=spec,
        results=[SweepResult.of(figures, spec) for figures in results],
    )


def write_results(out_dir: Path, sweep: WhatIfSweep) -> Path:
    """`whatif.json` in `out_dir`, written atomically."""
    path = out_dir / RESULTS_FILE
    temporary = out_dir / f".{RESULTS_FILE}.tmp-{os.getpid()}"
    temporary.write_text(json.dumps(sweep.to_json(), indent=2, sort_keys=True) + "\n")
    temporary.replace(path)
    return path


def read_results(out_dir: Path) -> WhatIfSweep:
    """A sweep's `whatif.json`."""
    path = out_dir / RESULTS_FILE
    try:
        return msgspec.json.decode(path.read_bytes(), type=WhatIfSweep)
    except (OSError, msgspec.DecodeError) as error:
        raise TraceError(path, 0, f"not a kvscope what-if result: {error}") from error
