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
An engine's load depends on the timing. In the sequential timing (`Fleet` below) each engine
serves its own requests one at a time in arrival order (`Simulator.run_sequential`), the
whole request at its trace time, so none is ever unfinished when the next arrives: its load
is the requests routed to it so far. Least-loaded thus balances the requests routed (in this
timing it routes as round-robin does), and prefix-affinity sends a prefix no engine holds to
the engine routed fewest. In the scheduler timing each engine is a vLLM Scheduler of its own,
all on one clock (`run_engines` in scheduler_replay.py): its load is the requests it is
serving when the request arrives, waiting and running, as a router reading each engine's
queue sees them. Load ties go to the lowest index.

Each engine's records carry engine_id `engine-{i}` and DP rank 0, and are numbered by its
own hooks, as a live collector names and numbers the streams of N engines.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from collector.replay.block_manager import (
    CacheSettings,
    cached_prefix_blocks,
    make_kv_cache_manager,
)
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


class Routable(Protocol):
    """What a router reads of an engine: its load and its prefix cache."""

    @property
    def load(self) -> int: ...

    def cached_prefix_blocks(self, block_hashes: Sequence[BlockHash]) -> int: ...


class Router:
    """Picks the engine a request goes to, at its arrival (see above)."""

    def __init__(self, name: str, block_hasher: BlockHasher) -> None:
        self.name = name
        self.block_hasher = block_hasher

    def pick(self, engines: Sequence[Routable], trace_request: TraceRequest, index: int) -> int:
        """The index of the engine request number `index` (in arrival order) goes to."""
        numbers = range(len(engines))
        if self.name == "round-robin":
            return index % len(engines)
        if self.name == "least-loaded":
            return min(numbers, key=lambda number: engines[number].load)
        block_hashes = vllm_request(trace_request, self.block_hasher).block_hashes

        def rank(number: int) -> tuple[int, int]:
            engine = engines[number]
            return -engine.cached_prefix_blocks(block_hashes), engine.load

        return min(numbers, key=rank)  # min keeps the first of equals: the lowest index


@dataclass
class FleetEngine:
    """One engine of the fleet: its name, its replay (manager and hooks), its load."""

    engine_id: str
    simulator: Simulator
    num_routed: int = 0

    @property
    def load(self) -> int:
        """The requests routed to it so far (in this timing, none is ever unfinished)."""
        return self.num_routed

    def cached_prefix_blocks(self, block_hashes: Sequence[BlockHash]) -> int:
        """How many of `block_hashes`, from the first, this engine's prefix cache holds."""
        return cached_prefix_blocks(self.simulator.manager, block_hashes)


class Fleet:
    """N engines behind a router, replaying a trace in the sequential timing."""

    def __init__(self, engines: list[FleetEngine], router: str, block_hasher: BlockHasher):
        self.engines = engines
        self.router = Router(router, block_hasher)

    def route(self, trace_request: TraceRequest, index: int) -> FleetEngine:
        """The engine request number `index` (in arrival order) goes to, counted as routed."""
        engine = self.engines[self.router.pick(self.engines, trace_request, index)]
        engine.num_routed += 1
        return engine

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
        drain = engine_drain(buffer, engine_id, append)
        engines.append(
            FleetEngine(engine_id, Simulator(manager, hooks, clock, block_hasher, drain))
        )
    return Fleet(engines, router, block_hasher)


def engine_drain(
    buffer: EventBuffer, engine_id: str, append: Callable[[list[Event]], object]
) -> Callable[[], None]:
    """What drains `buffer` into `append` after each step, naming its records' engine."""

    def drain() -> None:
        records = buffer.take()
        for record in records:
            record.engine_id = engine_id
        append(records)

    return drain
