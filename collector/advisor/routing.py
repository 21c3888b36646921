"""Routing: what a prefix-aware router would win over round-robin on a run of several engines.

A run that recorded its prompts and ran on more than one engine (engine id x DP rank) is
replayed as a fleet of as many engines, each with the run's pool, once behind a round-robin
router and once behind a prefix-affinity one (collector/replay/fleet.py), one request at a
time (the sequential timing; `kvscope whatif RUN --engines N --timing scheduler` replays N
engines through vLLM's Scheduler at the run's arrival times). The rule fires when
prefix-affinity wins at least MIN_ROUTING_GAIN of token hit ratio; its evidence shows the
load each router puts on the busiest engine, since sending a family to the engine that holds
it can pile load there.
Each replay writes a run file into a temporary folder, removed after.
"""

from __future__ import annotations

from dataclasses import dataclass

from collector.advisor.context import RunContext
from collector.advisor.miss_breakdown import quote_causes
from collector.advisor.replay_folder import replay_folder
from collector.advisor.scheduler_check import MAX_PROMPT_TOKENS, SECRET
from collector.advisor.suggestion import (
    NotApplicable,
    NothingToWin,
    Suggestion,
    severity_for_gain,
)
from collector.model.kv_memory import gib_for_blocks
from collector.queries import fleet
from collector.queries.fleet import DuplicationSummary
from collector.replay.block_manager import CacheSettings
from collector.replay.replayer import ReplayOptions, replay_requests
from collector.store.run_file import RunFile

MIN_ROUTING_GAIN = 0.02  # of token hit ratio: 2 points
ROUTERS_COMPARED = ("round-robin", "prefix-affinity")


@dataclass(frozen=True)
class RoutedReplay:
    """One router's fleet replay: its token hit ratio, and the busiest engine's requests
    against the fleet's mean (1.0: even)."""

    router: str
    token_hit_ratio: float
    busiest_requests: int
    busiest_over_mean: float


@dataclass(frozen=True)
class RouterComparison:
    """The run replayed across its engines behind round-robin and behind prefix-affinity."""

    num_engines: int
    round_robin: RoutedReplay
    affinity: RoutedReplay

    @property
    def gain(self) -> float:
        """Points of token hit ratio prefix-affinity wins over round-robin."""
        return self.affinity.token_hit_ratio - self.round_robin.token_hit_ratio


@dataclass(frozen=True)
class MeasuredFleet:
    """What the run's own fleet measured: its busiest engine's requests (and against the
    mean), and the blocks cached on more than one engine at once."""

    busiest_requests: int
    busiest_over_mean: float
    mean_requests: float
    duplication: DuplicationSummary


def routing(context: RunContext) -> list[Suggestion]:
    """One suggestion when prefix-affinity routing beats round-robin by MIN_ROUTING_GAIN."""
    num_engines = fleet.num_engines(context.run)
    if num_engines <= 1:
        raise NotApplicable("one engine: routing does not apply")
    if not context.has_token_ids:
        raise NotApplicable(
            "it replays the run's prompts across its engines, which this run did not record "
            "(replay with --record-token-ids)"
        )
    if context.prompt_tokens > MAX_PROMPT_TOKENS:
        raise NotApplicable(
            f"the run has {context.prompt_tokens:,} prompt tokens, more than the "
            f"{MAX_PROMPT_TOKENS:,} the advisor replays (run `kvscope replay` on its trace "
            f"with --engines {num_engines} and each --router)"
        )
    replays = fleet_replays(context, num_engines)
    compared = RouterComparison(num_engines, replays["round-robin"], replays["prefix-affinity"])
    if compared.gain < MIN_ROUTING_GAIN:
        raise NothingToWin(_too_little(context, compared))
    return [_suggestion(context, compared, measure_fleet(context, num_engines))]


def measure_fleet(context: RunContext, num_engines: int) -> MeasuredFleet:
    """The run's own fleet: its engines' load, and its blocks cached on several at once."""
    gib_per_block = gib_for_blocks(context.spec, context.block_size, 1)
    duplication = fleet.duplication_summary(context.run, gib_per_block)
    measured = fleet.fleet_engines(context.run)
    return MeasuredFleet(
        busiest_requests=int(measured["requests"].max()),
        busiest_over_mean=fleet.load_imbalance(measured)["requests"],
        mean_requests=context.summary["requests"] / num_engines,
        duplication=duplication,
    )


def fleet_replays(context: RunContext, num_engines: int) -> dict[str, RoutedReplay]:
    """The run's requests replayed across `num_engines` engines behind each compared router."""
    config = context.config
    settings = CacheSettings(context.block_size, context.num_blocks, config["hash_algo"])
    replays = {}
    with replay_folder("the fleet replay") as directory:
        for router in ROUTERS_COMPARED:
            out = directory / f"{router}.duckdb"
            options = ReplayOptions(
                settings=settings, timing="sequential", engines=num_engines, router=router
            )
            summary = replay_requests(context.requests, context.path, out, options, SECRET)
            with RunFile.open(out) as replayed:
                engines = fleet.fleet_engines(replayed)
            replays[router] = RoutedReplay(
                router,
                float(summary["token_hit_ratio"]),
                int(engines["requests"].max()),
                fleet.load_imbalance(engines)["requests"],
            )
    return replays


def _too_little(context: RunContext, compared: RouterComparison) -> str:
    return (
        f"replayed across {compared.num_engines} engines of {context.num_blocks:,} blocks, "
        f"prefix-affinity routing hits {compared.affinity.token_hit_ratio:.1%} of prompt "
        f"tokens and round-robin {compared.round_robin.token_hit_ratio:.1%}: "
        f"{compared.gain * 100:.1f} points (under {MIN_ROUTING_GAIN * 100:.0f}), so where a "
        "request lands barely changes what it hits"
    )


def _suggestion(
    context: RunContext, compared: RouterComparison, measured: MeasuredFleet
) -> Suggestion:
    round_robin, affinity, gain = compared.round_robin, compared.affinity, compared.gain
    duplication = measured.duplication
    quote = quote_causes(context.miss_breakdown, "other_engine")
    return Suggestion(
        rule="routing",
        title=f"Prefix-aware routing would win {gain * 100:.1f} points over round-robin",
        severity=severity_for_gain(gain),
        evidence=[*_evidence(context, compared, measured), *quote.lines],
        effect=(
            f"token hit ratio {round_robin.token_hit_ratio:.1%} -> "
            f"{affinity.token_hit_ratio:.1%} (+{gain * 100:.1f} points) across "
            f"{compared.num_engines} engines, per fleet replays one request at a time (no "
            "overlap, no queueing)"
        ),
        action=(
            "route requests to the engine that holds their prefix: llm-d's precise "
            "prefix-cache-aware scorer (fed by vLLM's KV events), NVIDIA Dynamo's KV-aware "
            "router, or the vLLM production stack's prefix-aware routing; keep a load "
            "term in the score so a hot prefix does not overload one engine"
        ),
        gain_tokens=gain * context.prompt_tokens,
        figures={
            "num_engines": compared.num_engines,
            "round_robin_token_hit_ratio": round_robin.token_hit_ratio,
            "prefix_affinity_token_hit_ratio": affinity.token_hit_ratio,
            "measured_token_hit_ratio": float(context.summary["token_hit_ratio"]),
            "round_robin_busiest_requests": round_robin.busiest_requests,
            "prefix_affinity_busiest_requests": affinity.busiest_requests,
            "round_robin_busiest_over_mean": round_robin.busiest_over_mean,
            "prefix_affinity_busiest_over_mean": affinity.busiest_over_mean,
            "peak_duplicated_blocks": duplication["peak_duplicated_blocks"],
            "mean_duplicated_blocks": duplication["mean_duplicated_blocks"],
            "peak_duplicated_gib": duplication["peak_duplicated_gib"],
            "mean_duplicated_gib": duplication["mean_duplicated_gib"],
            **quote.figures,
        },
    )


def _evidence(
    context: RunContext, compared: RouterComparison, measured: MeasuredFleet
) -> list[str]:
    round_robin, affinity = compared.round_robin, compared.affinity
    duplication = measured.duplication
    hot_spot = (
        "routing by prefix piles a hot family onto one engine here"
        if affinity.busiest_over_mean > round_robin.busiest_over_mean
        else "routing by prefix makes no hot spot here"
    )
    return [
        f"the run's requests replayed across {compared.num_engines} engines of "
        f"{context.num_blocks:,} blocks each, one request at a time: round-robin "
        f"{round_robin.token_hit_ratio:.1%} token hit ratio, prefix-affinity "
        f"{affinity.token_hit_ratio:.1%}",
        f"measured on this run's fleet: {context.summary['token_hit_ratio']:.1%} token hit "
        f"ratio; its busiest engine took {measured.busiest_requests:,} requests "
        f"({measured.busiest_over_mean:.2f}x the mean)",
        f"blocks cached on more than one engine at once (extra copies): "
        f"{duplication['peak_duplicated_blocks']:,} at the peak "
        f"({duplication['peak_duplicated_gib']:.2f} GiB, {duplication['peak_share']:.0%} of "
        f"the fleet's cached blocks then), {duplication['mean_duplicated_blocks']:,.1f} on "
        f"average ({duplication['mean_duplicated_gib']:.2f} GiB, {context.spec.describe()})",
        f"load on the busiest engine: round-robin {round_robin.busiest_requests:,} requests "
        f"({round_robin.busiest_over_mean:.2f}x the mean of {measured.mean_requests:,.1f}), "
        f"prefix-affinity {affinity.busiest_requests:,} ({affinity.busiest_over_mean:.2f}x): "
        + hot_spot,
    ]
