"""`kvscope replay`: a trace through vLLM's real KV cache manager, hooks attached, into a run file.

The run file appears only when the replay succeeded: it is written under a temporary name
beside the destination and renamed at the end; any error removes it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from collector.model.step_model import StepModel
from collector.model.trace_request import TraceRequest
from collector.queries.summary import RunSummary, run_summary
from collector.replay.block_manager import (
    CacheSettings,
    kv_groups,
    make_block_hasher,
    make_kv_cache_manager,
    require_vllm,
)
from collector.replay.cpu_tier import TIER_POLICIES, CpuTier
from collector.replay.fleet import (
    ROUTERS,
    MakeHooks,
    Router,
    engine_drain,
    engine_name,
    make_fleet,
)
from collector.replay.scheduler_replay import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    SchedulerLimits,
    SchedulerReplay,
    run_engines,
)
from collector.replay.scheduler_tier import TierSettings
from collector.replay.simulator import CacheTooSmall, Simulator, VirtualClock
from collector.replay.tier_events import TierEvents
from collector.replay.traces import TraceError, read_trace
from collector.store.run_file import RunConfig, RunStore, StoreError
from engine_hooks.buffer import EventBuffer
from engine_hooks.hooks import KVCacheHooks
from engine_hooks.privacy import Pseudonymizer

TIMINGS = ("sequential", "timestamps", "scheduler")


@dataclass(frozen=True)
class ReplayOptions:
    """Everything a replay varies besides the trace itself."""

    settings: CacheSettings = field(default_factory=CacheSettings)
    timing: str = "sequential"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS  # scheduler timing
    max_loras: int = 1  # scheduler timing
    step_model: StepModel = field(default_factory=StepModel)
    trace_format: str = "auto"
    limit: int | None = None
    record_token_ids: bool = False
    tokenizer: str | None = None
    reveal_tenants: bool = False
    check_collisions: bool = True  # and the key-free fingerprints (fingerprint.py)
    cpu_tier_blocks: int = 0  # a CPU offload tier of this many GPU-block-sized chunks
    cpu_tier_policy: str = "lru"
    engines: int = 1  # a fleet of this many engines behind `router` (collector/replay/fleet.py)
    router: str = "round-robin"
    dp_size: int = 1  # data-parallel ranks an engine, each a pool of its own

    @property
    def num_pools(self) -> int:
        """The fleet's KV cache pools: an engine's, or each DP rank's."""
        return self.engines * self.dp_size

    def __post_init__(self) -> None:
        if self.cpu_tier_blocks < 0:
            raise ValueError(f"--cpu-tier-blocks must be 0 or more, got {self.cpu_tier_blocks}")
        if self.cpu_tier_policy not in TIER_POLICIES:
            raise ValueError(
                f"unknown --cpu-tier-policy {self.cpu_tier_policy!r}; use one of {TIER_POLICIES}"
            )
        if self.cpu_tier_blocks and self.settings.kv_layout != "full":
            raise ValueError(
                "a CPU tier replays with one full-attention KV cache group only "
                f"(--kv-layout full), not {self.settings.kv_layout!r}"
            )
        if self.timing not in TIMINGS:
            raise ValueError(f"unknown timing {self.timing!r}; use one of {TIMINGS}")
        if self.max_num_seqs < 1:
            raise ValueError(f"--max-num-seqs must be at least 1, got {self.max_num_seqs}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"--limit must be at least 1, got {self.limit}")
        self._check_fleet()

    def _check_fleet(self) -> None:
        if self.engines < 1:
            raise ValueError(f"--engines must be at least 1, got {self.engines}")
        if self.dp_size < 1:
            raise ValueError(f"--dp-size must be at least 1, got {self.dp_size}")
        if self.router not in ROUTERS:
            raise ValueError(f"unknown --router {self.router!r}; use one of {ROUTERS}")
        if self.num_pools == 1:
            return
        ranks = f" --dp-size {self.dp_size}" * (self.dp_size > 1)
        fleet = f"a fleet replay (--engines {self.engines}{ranks})"
        if self.timing not in ("sequential", "scheduler"):
            raise ValueError(f"{fleet} takes --timing sequential or scheduler, not {self.timing!r}")
        if self.cpu_tier_blocks:
            raise ValueError(f"{fleet} takes no CPU tier for now")
        if self.settings.kv_layout != "full":
            raise ValueError(
                f"{fleet} replays one full-attention KV cache group only (--kv-layout full) "
                f"for now, not {self.settings.kv_layout!r}"
            )


def load_requests(trace_path: Path, options: ReplayOptions) -> list[TraceRequest]:
    """The trace's requests, its first `--limit` only (no line after them is read)."""
    return read_trace(trace_path, options.trace_format, options.limit)


def replay(
    trace_path: Path,
    out_path: Path,
    options: ReplayOptions,
    secret: bytes,
    progress: Callable[[int], None] | None = None,
) -> RunSummary:
    """Replay a trace into a new run file and return its summary."""
    requests = load_requests(trace_path, options)
    return replay_requests(requests, trace_path, out_path, options, secret, progress=progress)


def replay_requests(
    requests: list[TraceRequest],
    source: Path,
    out_path: Path,
    options: ReplayOptions,
    secret: bytes,
    *,
    progress: Callable[[int], None] | None = None,
) -> RunSummary:
    """Replay requests read from `source` (a trace, or a run's recorded requests) into a new
    run file and return its summary."""
    if out_path.exists():
        raise StoreError(f"{out_path}: already exists; kvscope does not overwrite runs")
    temporary = out_path.with_name(f".{out_path.name}.tmp-{os.getpid()}")
    temporary.unlink(missing_ok=True)
    config = _run_config(source, options)
    store = RunStore.create(temporary, config)
    try:
        try:
            replay_into(store, requests, options, secret, progress or (lambda _: None))
        except CacheTooSmall as error:
            raise TraceError(source, error.line, error.reason) from error
        summary = run_summary(store)
        store.close()
        os.replace(temporary, out_path)
    except BaseException:
        store.close()
        temporary.unlink(missing_ok=True)
        raise
    return summary


def replay_into(
    store: RunStore,
    requests: list[TraceRequest],
    options: ReplayOptions,
    secret: bytes,
    progress: Callable[[int], None],
) -> None:
    """Replay with hooks attached, streaming records into `store`."""
    clock = VirtualClock()
    buffer = EventBuffer()
    made: list[KVCacheHooks] = []

    def make_hooks(manager: Any, engine_buffer: EventBuffer = buffer) -> KVCacheHooks:
        hooks = KVCacheHooks(
            manager,
            engine_buffer,
            pseudonymizer=Pseudonymizer(secret, reveal_tenants=options.reveal_tenants),
            clock=clock,
            record_token_ids=options.record_token_ids,
            check_collisions=options.check_collisions,
        )
        made.append(hooks)
        return hooks

    def drain() -> None:
        store.append(buffer.take())

    vllm_prefix_cache: tuple[int, int] | None
    if options.timing == "scheduler":
        vllm_prefix_cache = _replay_schedulers(
            store,
            requests,
            options,
            clock=clock,
            one_engine=(buffer, drain),
            make_hooks=make_hooks,
            progress=progress,
        )
    elif options.num_pools > 1:
        vllm_prefix_cache = _replay_fleet(
            store, requests, options, clock=clock, make_hooks=make_hooks, progress=progress
        )
    else:
        vllm_prefix_cache = _simulate(
            store,
            requests,
            options,
            clock=clock,
            buffer=buffer,
            make_hooks=make_hooks,
            progress=progress,
        )
    lost = sum(hooks.num_lost for hooks in made)
    if lost:
        raise RuntimeError(f"replay lost {lost} records; this is a kvscope bug")
    store.finalize(vllm_prefix_cache=vllm_prefix_cache)


def _replay_schedulers(
    store: RunStore,
    requests: list[TraceRequest],
    options: ReplayOptions,
    *,
    clock: VirtualClock,
    one_engine: tuple[EventBuffer, Callable[[], None]],
    make_hooks: MakeHooks,
    progress: Callable[[int], None],
) -> tuple[int, int]:
    """The scheduler timing: one vLLM Scheduler (its records in `one_engine`'s buffer and
    drained by its drain, naming no engine), or one per engine of a fleet behind its router,
    all on one clock; returns vLLM's prefix-cache counters summed over them."""
    settings = options.settings
    block_hasher = make_block_hasher(settings)
    limits = SchedulerLimits(
        options.max_num_seqs, options.max_num_batched_tokens, options.max_loras
    )
    tier = (
        TierSettings(options.cpu_tier_blocks, options.cpu_tier_policy)
        if options.cpu_tier_blocks
        else None
    )
    replays = []
    for number in range(options.num_pools):
        engine_buffer, on_step = one_engine
        if options.num_pools > 1:
            engine_buffer = EventBuffer()
            engine_id, dp_rank = engine_name(number, options.dp_size)
            on_step = engine_drain(engine_buffer, engine_id, dp_rank, store.append)
        replay = SchedulerReplay(
            settings,
            limits,
            step_model=options.step_model,
            block_hasher=block_hasher,
            clock=clock,
            on_step=on_step,
            tier=tier,
            tier_events=TierEvents(store, settings.block_size) if tier else None,
        )
        replay.start(requests, partial(_scheduler_hooks, make_hooks, engine_buffer))
        replays.append(replay)
    router = Router(options.router, block_hasher, options.dp_size)
    try:
        run_engines(
            replays,
            requests,
            lambda request, index: router.pick_rank(replays, request, index),
            progress,
        )
    finally:
        for replay in replays:
            replay.stop()
    return (
        sum(replay.prefix_cache_queries for replay in replays),
        sum(replay.prefix_cache_hits for replay in replays),
    )


def _scheduler_hooks(make_hooks: MakeHooks, buffer: EventBuffer, scheduler: Any) -> KVCacheHooks:
    """Hooks on `scheduler`'s KV cache manager, recording into `buffer`."""
    return make_hooks(scheduler.kv_cache_manager, buffer)


def _replay_fleet(
    store: RunStore,
    requests: list[TraceRequest],
    options: ReplayOptions,
    *,
    clock: VirtualClock,
    make_hooks: MakeHooks,
    progress: Callable[[int], None],
) -> tuple[int, int] | None:
    """The sequential timing across a fleet of engines; returns vLLM's prefix-cache
    counters summed over them."""
    fleet = make_fleet(
        options.settings,
        Router(options.router, make_block_hasher(options.settings), options.dp_size),
        options.engines,
        clock=clock,
        make_hooks=make_hooks,
        append=store.append,
    )
    try:
        fleet.run_sequential(requests, progress)
    finally:
        fleet.detach()
    return fleet.prefix_cache_counters()


def _simulate(
    store: RunStore,
    requests: list[TraceRequest],
    options: ReplayOptions,
    *,
    clock: VirtualClock,
    buffer: EventBuffer,
    make_hooks: Callable[[Any], KVCacheHooks],
    progress: Callable[[int], None],
) -> tuple[int, int] | None:
    """kvscope's own timings (sequential, timestamps) over vLLM's KV cache manager, a CPU
    tier beside it if asked; returns vLLM's prefix-cache counters."""
    settings = options.settings
    manager = make_kv_cache_manager(settings)
    hooks = make_hooks(manager).attach()
    tier = (
        CpuTier(options.cpu_tier_blocks, options.cpu_tier_policy, events=True)
        if options.cpu_tier_blocks
        else None
    )
    publish = TierEvents(store, settings.block_size) if tier else None

    def drain() -> None:
        store.append(buffer.take())
        if tier and publish:
            publish(clock(), tier.take_events())

    block_hasher = make_block_hasher(settings)
    simulator = Simulator(manager, hooks, clock, block_hasher, on_step=drain, tier=tier)
    try:
        if options.timing == "sequential":
            simulator.run_sequential(requests, progress)
        else:
            simulator.run_timestamps(requests, options.max_num_seqs, options.step_model, progress)
    finally:
        hooks.detach()
    stats = manager.make_prefix_cache_stats()  # None only when built with log_stats=False
    return (stats.queries, stats.hits) if stats else None


def _run_config(trace_path: Path, options: ReplayOptions) -> RunConfig:
    settings = options.settings
    return RunConfig(
        source="replay",
        trace=str(trace_path),
        timing=options.timing,
        block_size=settings.block_size,
        num_blocks=settings.num_blocks,
        hash_algo=settings.hash_algo,
        max_num_seqs=1 if options.timing == "sequential" else options.max_num_seqs,
        vllm_version=require_vllm(),
        options={
            "step_model": asdict(options.step_model),
            "max_num_batched_tokens": options.max_num_batched_tokens
            if options.timing == "scheduler"
            else None,
            "max_loras": options.max_loras if options.timing == "scheduler" else None,
            "trace_format": options.trace_format,
            "limit": options.limit,
            "record_token_ids": options.record_token_ids,
            "tokenizer": options.tokenizer,
            "reveal_tenants": options.reveal_tenants,
            "check_collisions": options.check_collisions,
            "kv_layout": settings.kv_layout,
            "kv_groups": kv_groups(settings),
            "cpu_tier": {"num_blocks": options.cpu_tier_blocks, "policy": options.cpu_tier_policy}
            if options.cpu_tier_blocks
            else None,
            "engines": options.engines,
            "router": options.router if options.engines > 1 else None,
            "dp_size": options.dp_size,
        },
    )
