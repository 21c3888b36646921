"""A fleet: N engines, each with its own vLLM KV cache manager and hooks, behind a router.

The router assigns each request, at its arrival, to one engine:
- round-robin: request i goes to engine i mod N, in arrival order.
- prefix-affinity: to the engine whose prefix cache holds the longest prefix of the
  request's block hashes right now, read from each engine's own block pool hash by hash
  from the first, to the first miss (`BlockPool.get_cached_block`: unlike
  `get_computed_blocks`, it counts no prefix-cache query). llm-d's precise prefix-cache
  scorer ranks engines this way, from their KV events. Ties, no hit anywhere included, go
  to the least loaded of the tied engines.
- least-loaded: to the least loaded engine.
An engine's load is the requests it has been routed so far: each engine serves its own
requests one at a time in arrival order (the sequential timing, `Simulator.run_sequential`),
the whole request at its trace time, so none is ever unfinished when the next arrives.
Least-loaded thus balances the requests routed (in this timing it routes as round-robin
does), and prefix-affinity sends a prefix no engine holds to the engine routed fewest.
Load ties go to the lowest index.

Each engine's records carry engine_id `engine-{i}` and DP rank 0, and are numbered by its
own hooks, as a live collector names and numbers the streams of N engines.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from collector.replay.block_manager import CacheSettings, make_kv_cache_manager
from collector.replay.simulator import Simulator, VirtualClock, vllm_request
from collector.replay.traces import TraceRequest
from engine_hooks.buffer import EventBuffer
from engine_hooks.events import Event
from engine_hooks.hooks import KVCacheHooks

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_utils import BlockHash

    from collector.replay.block_manager import BlockHasher

ROUTERS = ("round-robin", "prefix-affinity", "least-loaded")

MakeHooks = Callable[[Any, EventBuffer], KVCacheHooks]


@dataclass
class FleetEngine:
    """One engine of the fleet: its name, its replay (manager and hooks), its load."""

    engine_id: str
    simulator: Simulator
    num_routed: int = 0

    def cached_prefix_blocks(self, block_hashes: Sequence[BlockHash]) -> int:
        """How many of `block_hashes`, from the first, this engine's prefix cache holds."""
        manager = self.simulator.manager
        group_ids = list(range(manager.num_kv_cache_groups))
        for count, block_hash in enumerate(block_hashes):
            if manager.block_pool.get_cached_block(block_hash, group_ids) is None:
                return count
        return len(block_hashes)


class Fleet:
    """N engines behind a router, replaying a trace in the sequential timing."""

    def __init__(self, engines: list[FleetEngine], router: str, block_hasher: BlockHasher):
        self.engines = engines
        self.router = router
        self.block_hasher = block_hasher

    def route(self, trace_request: TraceRequest, index: int) -> FleetEngine:
        """The engine request number `index` (in arrival order) goes to, counted as routed."""
        if self.router == "round-robin":
            engine = self.engines[index % len(self.engines)]
        elif self.router == "least-loaded":
            engine = min(self.engines, key=_load)
        else:
            engine = self._by_prefix(trace_request)
        engine.num_routed += 1
        return engine

    def _by_prefix(self, trace_request: TraceRequest) -> FleetEngine:
        block_hashes = vllm_request(trace_request, self.block_hasher).block_hashes

        def rank(engine: FleetEngine) -> tuple[int, int]:
            return -engine.cached_prefix_blocks(block_hashes), _load(engine)

        return min(self.engines, key=rank)  # min keeps the first of equals: the lowest index

    def run_sequential(self, trace: list[TraceRequest], progress: Callable[[int], None]) -> None:
        """Route each request at its arrival and serve it whole on its engine."""
        for index, trace_request in enumerate(trace):
            engine = self.route(trace_request, index)
            engine.simulator.run_sequential([trace_request], progress, first_index=index)

    def prefix_cache_counters(self) -> tuple[int, int] | None:
        """vLLM's prefix-cache queries and hits, summed over the engines."""
        counters = [engine.simulator.manager.make_prefix_cache_stats() for engine in self.engines]
        if any(stats is None for stats in counters):
            return None
        return (
            sum(stats.queries for stats in counters if stats),
            sum(stats.hits for stats in counters if stats),
        )

    def detach(self) -> None:
        """Take every engine's hooks off its manager."""
        for engine in self.engines:
            if engine.simulator.hooks:
                engine.simulator.hooks.detach()


def make_fleet(
    settings: CacheSettings,
    num_engines: int,
    router: str,
    *,
    block_hasher: BlockHasher,
    clock: VirtualClock,
    make_hooks: MakeHooks,
    append: Callable[[list[Event]], object],
) -> Fleet:
    """`num_engines` engines of `settings` (each pool that big), hooks attached, each
    step's records named by engine and handed to `append`."""
    engines = []
    for number in range(num_engines):
        engine_id = f"engine-{number}"
        manager = make_kv_cache_manager(settings)
        buffer = EventBuffer()
        hooks = make_hooks(manager, buffer).attach()
        drain = _drain(buffer, engine_id, append)
        engines.append(
            FleetEngine(engine_id, Simulator(manager, hooks, clock, block_hasher, drain))
        )
    return Fleet(engines, router, block_hasher)


def _drain(
    buffer: EventBuffer, engine_id: str, append: Callable[[list[Event]], object]
) -> Callable[[], None]:
    def drain() -> None:
        records = buffer.take()
        for record in records:
            record.engine_id = engine_id
        append(records)

    return drain


def _load(engine: FleetEngine) -> int:
    return engine.num_routed
