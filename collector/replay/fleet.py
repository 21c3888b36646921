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

An engine may run several data-parallel ranks (`--dp-size K`), each a pool of its own, as
`vllm serve --data-parallel-size K` runs them behind one API server. The router sees an
engine as a whole: its load is its ranks' summed, its prefix cache the longest any rank
holds. The engine then gives the request to a rank as vLLM's own DP load balancer does:
`DPLBAsyncMPClient.get_core_engine_for_request`, called as it is (`DataParallelBalancer`
below), picks the rank of least max(in-flight, waiting + running), plus a penalty for
waiting requests when its KV cache is over half full, starting its scan one rank further
at each request; it knows nothing of prefixes. Its rank figures here are exact at the
request's arrival, where vLLM's DP coordinator reports them every 100 ms. In the
sequential timing every rank is idle at each arrival, so the ranks take turns.

Each rank's records carry engine_id `engine-{i}` and its DP rank, and are numbered by its
own hooks, as a live collector names and numbers the streams of N engines of K ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Protocol

from collector.model.trace_request import TraceRequest
from collector.replay.block_manager import (
    CacheSettings,
    cached_prefix_blocks,
    make_kv_cache_manager,
)
from collector.replay.simulator import Simulator, VirtualClock, vllm_request
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


class Rank(Routable, Protocol):
    """What vLLM's DP load balancer reads of a rank: its waiting and running requests and how
    full its KV cache is (0 to 1)."""

    @property
    def waiting(self) -> int: ...

    @property
    def running(self) -> int: ...

    @property
    def kv_usage(self) -> float: ...


@dataclass(frozen=True)
class _Ranks:
    """One engine's DP ranks, as the router sees the engine (see above)."""

    ranks: Sequence[Rank]

    @property
    def load(self) -> int:
        return sum(rank.load for rank in self.ranks)

    def cached_prefix_blocks(self, block_hashes: Sequence[BlockHash]) -> int:
        return max(rank.cached_prefix_blocks(block_hashes) for rank in self.ranks)


class DataParallelBalancer:
    """One engine's API server choosing a DP rank for each request, with vLLM's own code
    (`DPLBAsyncMPClient.get_core_engine_for_request`) on a stand-in for the client's state:
    the ranks' figures as its DP coordinator would report them, their requests in flight,
    and the rank its next scan starts from, which vLLM moves on at each request."""

    def __init__(self, dp_size: int) -> None:
        identities = [rank.to_bytes(2, "little") for rank in range(dp_size)]
        self._client = SimpleNamespace(
            core_engines=identities,
            client_count=1,
            eng_start_index=0,
            lb_engines=[],
            engine_inflight={},
            reqs_in_flight={},
            streaming_reqs=set(),
        )

    def pick(self, ranks: Sequence[Rank], request_id: str) -> int:
        """The index of the rank vLLM gives request `request_id` to."""
        from vllm.v1.engine.core_client import DPLBAsyncMPClient  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

        client = self._client
        client.lb_engines = [[rank.waiting, rank.running, rank.kv_usage] for rank in ranks]
        client.engine_inflight = {
            identity: waiting + running
            for identity, (waiting, running, _) in zip(
                client.core_engines, client.lb_engines, strict=True
            )
        }
        client.reqs_in_flight = {}  # no request comes twice: no session to keep on a rank
        request = SimpleNamespace(
            request_id=request_id, resumable=False, data_parallel_rank=None, pooling_params=None
        )
        chosen = DPLBAsyncMPClient.get_core_engine_for_request(client, request)  # type: ignore[arg-type]
        return int(client.core_engines.index(chosen))


class Router:
    """Picks the engine a request goes to, at its arrival, and the DP rank there (see
    above)."""

    def __init__(self, name: str, block_hasher: BlockHasher, dp_size: int = 1) -> None:
        self.name = name
        self.block_hasher = block_hasher
        self.dp_size = dp_size
        self._balancers: dict[int, DataParallelBalancer] = {}

    def pick_rank(self, ranks: Sequence[Rank], trace_request: TraceRequest, index: int) -> int:
        """The index in `ranks` (each engine's DP ranks in turn) of the rank request number
        `index` (in arrival order) goes to."""
        if self.dp_size == 1:
            return self.pick(ranks, trace_request, index)
        size = self.dp_size
        engines = [_Ranks(ranks[first : first + size]) for first in range(0, len(ranks), size)]
        number = self.pick(engines, trace_request, index)
        balancer = self._balancers.setdefault(number, DataParallelBalancer(size))
        return number * size + balancer.pick(engines[number].ranks, trace_request.request_id)

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
    """One engine (or DP rank) of the fleet: its engine's name, its replay (manager and
    hooks), its load."""

    engine_id: str
    simulator: Simulator
    num_routed: int = 0

    @property
    def load(self) -> int:
        """The requests routed to it so far (in this timing, none is ever unfinished)."""
        return self.num_routed

    @property
    def waiting(self) -> int:
        return 0  # every request routed before has finished

    @property
    def running(self) -> int:
        return 0

    @property
    def kv_usage(self) -> float:
        return float(self.simulator.manager.usage)

    def cached_prefix_blocks(self, block_hashes: Sequence[BlockHash]) -> int:
        """How many of `block_hashes`, from the first, this engine's prefix cache holds."""
        return cached_prefix_blocks(self.simulator.manager, block_hashes)


class Fleet:
    """N engines behind a router, replaying a trace in the sequential timing."""

    def __init__(self, engines: list[FleetEngine], router: Router):
        self.engines = engines
        self.router = router

    def route(self, trace_request: TraceRequest, index: int) -> FleetEngine:
        """The engine (or rank) request number `index` (in arrival order) goes to, counted as
        routed."""
        engine = self.engines[self.router.pick_rank(self.engines, trace_request, index)]
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
    router: Router,
    num_engines: int,
    *,
    clock: VirtualClock,
    make_hooks: MakeHooks,
    append: Callable[[list[Event]], object],
) -> Fleet:
    """`num_engines` engines of `router.dp_size` ranks of `settings` (each pool that big),
    hooks attached, each step's records named by engine and rank and handed to `append`."""
    engines = []
    for number in range(num_engines * router.dp_size):
        engine_id, dp_rank = engine_name(number, router.dp_size)
        manager = make_kv_cache_manager(settings)
        buffer = EventBuffer()
        hooks = make_hooks(manager, buffer).attach()
        drain = engine_drain(buffer, engine_id, dp_rank, append)
        simulator = Simulator(manager, hooks, clock, router.block_hasher, drain)
        engines.append(FleetEngine(engine_id, simulator))
    return Fleet(engines, router)


def engine_name(number: int, dp_size: int) -> tuple[str, int]:
    """The engine id and DP rank of rank number `number` of a fleet (each engine's ranks in
    turn)."""
    return f"engine-{number // dp_size}", number % dp_size


def engine_drain(
    buffer: EventBuffer, engine_id: str, dp_rank: int, append: Callable[[list[Event]], object]
) -> Callable[[], None]:
    """What drains `buffer` into `append` after each step, naming its records' engine and
    DP rank."""

    def drain() -> None:
        records = buffer.take()
        for record in records:
            record.engine_id = engine_id
            record.dp_rank = dp_rank
        append(records)

    return drain
