"""A CPU offload tier: what one would catch of what the GPU pool evicts, and whether moving
it back over PCIe beats computing it again.

The run's block stream is replayed one request at a time (collector/model/policies.py) at
its pool size, with vLLM's own CPU offloading manager behind it (collector/replay/cpu_tier.py)
at TIER_SIZES times the pool, under each of its policies. A tier hit saves the prefill of
its block (priced as the ROI page prices a hit: collector/model/cost.py) and costs its KV
bytes over PCIe at `RunContext.pcie_gb_per_s`. The rule recommends the smallest size that
wins at least NEAR_BEST of what the largest wins, and fires only when that is at least
MIN_TIER_GAIN of token hit ratio and the transfer costs less time than the compute it saves.
A run of several engines (several pools, each with its own tier) is not judged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum

from collector.advisor.context import RunContext
from collector.advisor.suggestion import (
    Chart,
    NotApplicable,
    NothingToWin,
    Series,
    Suggestion,
    severity_for_gain,
)
from collector.model.cost import CostModel
from collector.model.kv_memory import gib_for_blocks
from collector.model.policies import (
    PolicyResult,
    ReplayTooLarge,
    check_replay_size,
    replay_policy,
)
from collector.replay.block_manager import VllmUnavailable
from collector.replay.cpu_tier import TIER_POLICIES, CpuTier

TIER_SIZES = (1, 2, 4)  # times the GPU pool
MIN_TIER_GAIN = 0.02  # of token hit ratio: 2 points
NEAR_BEST = 0.9  # the smallest size that wins this share of the largest's gain
ARC_MARGIN = 0.01  # ARC is recommended over vLLM's default LRU only 1 point ahead or more
MAX_BLOCK_REFERENCES = 2_000_000  # six replays of this many take about a minute here


@dataclass(frozen=True)
class TierReplays:
    """The run's block stream at its pool: vLLM's LRU alone, and with a CPU tier of each
    size (times the pool) under each policy, by (size, policy)."""

    lru: PolicyResult
    tiers: dict[tuple[int, str], PolicyResult]

    @property
    def most_gained(self) -> float:
        """The most token hit ratio any tier adds to LRU alone."""
        best = max(result.token_hit_ratio for result in self.tiers.values())
        return best - self.lru.token_hit_ratio


@dataclass(frozen=True)
class TierChoice:
    """The tier the rule would recommend: the smallest size near the best, ARC where it is
    ARC_MARGIN ahead of LRU; and what it gains over LRU alone."""

    size: int
    policy: str
    result: PolicyResult
    gain: float


class TierVerdict(Enum):
    """What the rule makes of the chosen tier."""

    TOO_LITTLE = "too-little"  # it gains under MIN_TIER_GAIN
    TOO_SLOW = "too-slow"  # its loads take longer than the prefill they save
    WORTH_IT = "worth-it"


def cpu_tier(context: RunContext) -> list[Suggestion]:
    """One suggestion when a CPU tier wins MIN_TIER_GAIN or more and pays for its transfers."""
    replays = replay_tiers(context)
    choice = choose_tier(replays)
    price = TierPrice(context, choice.result)
    verdict = decide(choice, price)
    if verdict is TierVerdict.TOO_LITTLE:
        raise NothingToWin(_too_little(replays))
    if verdict is TierVerdict.TOO_SLOW:
        raise NothingToWin(_too_slow(context, choice, price))
    return [_suggestion(context, replays, choice, price)]


def replay_tiers(context: RunContext) -> TierReplays:
    """The run's block stream replayed one request at a time at its pool, with vLLM's CPU
    offloading manager behind it at each size and policy; NotApplicable where it cannot be."""
    if context.num_engines > 1:
        raise NotApplicable(
            f"this run has {context.num_engines} engines, each with its own pool; the tier "
            "replay models one pool with one CPU tier behind it (replay each engine's share "
            "of the trace with --cpu-tier-blocks)"
        )
    stream, block_size, num_blocks = context.block_stream, context.block_size, context.num_blocks
    try:
        check_replay_size(stream, MAX_BLOCK_REFERENCES, "its tier replays take in a minute")
    except ReplayTooLarge as error:
        raise NotApplicable(str(error)) from None
    what = f"cpu-tier {block_size} {num_blocks} {TIER_SIZES} {TIER_POLICIES}"
    kept = context.replay_cache.get(what)
    if kept is not None:
        return TierReplays(
            PolicyResult(**kept["lru"]),
            {(size, policy): PolicyResult(**result) for size, policy, result in kept["tiers"]},
        )
    context.note(
        f"replaying the run with a CPU tier at {len(TIER_SIZES) * len(TIER_POLICIES)} settings "
        "(kept for later advice on this run)"
    )
    try:
        replays = TierReplays(
            lru=replay_policy(stream, block_size, num_blocks, "lru"),
            tiers={
                (size, policy): replay_policy(
                    stream,
                    block_size,
                    num_blocks,
                    "lru",
                    tier=CpuTier(size * (num_blocks - 1), policy),
                )
                for size in TIER_SIZES
                for policy in TIER_POLICIES
            },
        )
    except ValueError as error:
        raise NotApplicable(f"the tier replay cannot hold this run: {error}") from None
    except VllmUnavailable:
        raise NotApplicable(
            "it replays through vLLM's own CPU offloading manager, and this environment has "
            "no vLLM kvscope supports"
        ) from None
    context.replay_cache.put(
        what,
        {
            "lru": asdict(replays.lru),
            "tiers": [[*key, asdict(result)] for key, result in replays.tiers.items()],
        },
    )
    return replays


def choose_tier(replays: TierReplays) -> TierChoice:
    """The smallest size whose tier hits reach NEAR_BEST of the most any size gives; ARC
    there if it is ARC_MARGIN ahead of LRU, else LRU."""
    tiers = replays.tiers
    best_hits = max(result.tier_hit_blocks for result in tiers.values())
    size = next(
        size
        for size in TIER_SIZES
        if max(tiers[size, policy].tier_hit_blocks for policy in TIER_POLICIES)
        >= NEAR_BEST * best_hits
    )
    arc, plain = tiers[size, "arc"], tiers[size, "lru"]
    policy = "arc" if arc.token_hit_ratio - plain.token_hit_ratio >= ARC_MARGIN else "lru"
    chosen = tiers[size, policy]
    return TierChoice(size, policy, chosen, chosen.token_hit_ratio - replays.lru.token_hit_ratio)


def decide(choice: TierChoice, price: TierPrice) -> TierVerdict:
    """Worth it when the tier gains MIN_TIER_GAIN or more and its loads take less time than
    the prefill they save."""
    if choice.gain < MIN_TIER_GAIN:
        return TierVerdict.TOO_LITTLE
    if price.transfer_s >= price.compute_s:
        return TierVerdict.TOO_SLOW
    return TierVerdict.WORTH_IT


def _too_little(replays: TierReplays) -> str:
    return (
        f"a CPU tier up to {TIER_SIZES[-1]}x the GPU pool wins at most "
        f"{replays.most_gained * 100:.1f} "
        f"points of token hit ratio (under {MIN_TIER_GAIN * 100:.0f}): what the GPU pool "
        "evicts is rarely asked for again"
    )


def _too_slow(context: RunContext, choice: TierChoice, price: TierPrice) -> str:
    return (
        f"a CPU tier of {choice.size}x the GPU pool would win {choice.gain * 100:.1f} points, "
        f"but moving its hits back at {context.pcie_gb_per_s:g} GB/s takes "
        f"{price.transfer_s:.1f} s against the {price.compute_s:.1f} GPU-seconds of prefill "
        "they save"
    )


def _suggestion(
    context: RunContext, replays: TierReplays, choice: TierChoice, price: TierPrice
) -> Suggestion:
    tier_blocks = choice.size * (context.num_blocks - 1)
    tier_gib = gib_for_blocks(context.spec, context.block_size, tier_blocks)
    lru, chosen, gain = replays.lru, choice.result, choice.gain
    return Suggestion(
        rule="cpu-tier",
        title=f"A CPU tier of {tier_gib:.1f} GiB ({choice.policy.upper()}) would win "
        f"{gain * 100:.1f} points",
        severity=severity_for_gain(gain),
        evidence=_evidence(context, replays, choice, price),
        effect=(
            f"token hit ratio {lru.token_hit_ratio:.1%} -> {chosen.token_hit_ratio:.1%} "
            f"(+{gain * 100:.1f} points from the tier); net "
            f"{price.compute_s - price.transfer_s:.2f} s of GPU time over this run, "
            f"{price.net_ttft_ms:.1f} ms of TTFT per request on average (the transfer "
            "counted in full, not overlapped)"
        ),
        action=_action(context, choice.policy, tier_blocks, tier_gib),
        gain_tokens=gain * context.prompt_tokens,
        figures={
            "tier_blocks": tier_blocks,
            "tier_gib": tier_gib,
            "policy": choice.policy,
            "lru_token_hit_ratio": lru.token_hit_ratio,
            "tier_token_hit_ratio": chosen.token_hit_ratio,
            "tier_hit_blocks": chosen.tier_hit_blocks,
            "transfer_s": price.transfer_s,
            "compute_s": price.compute_s,
            "pcie_gb_per_s": context.pcie_gb_per_s,
        },
        charts=[_tier_chart(context, replays, tier_gib)],
    )


def _evidence(
    context: RunContext, replays: TierReplays, choice: TierChoice, price: TierPrice
) -> list[str]:
    evidence = [
        f"vLLM's LRU alone at the run's {context.num_blocks:,} blocks: "
        f"{replays.lru.token_hit_ratio:.1%} token hit ratio, one request at a time",
        *_size_lines(replays.tiers),
        f"{choice.result.tier_hit_blocks:,} blocks loaded back ({price.gigabytes:.2f} GB over "
        f"PCIe at {context.pcie_gb_per_s:g} GB/s: {price.transfer_s:.2f} s) save "
        f"{price.compute_s:.2f} GPU-seconds of prefill ({price.model.compute_assumptions()})",
    ]
    measured = context.summary["tier_hit_tokens"]
    if measured:
        evidence.append(
            f"this run has a tier already: it served {measured:,} prompt tokens "
            f"({context.summary['tier_token_hit_ratio']:.1%})"
        )
    return evidence


def _action(context: RunContext, policy: str, tier_blocks: int, tier_gib: float) -> str:
    """`vllm serve`'s offloading flags for the tier (its size summed over TP ranks)."""
    total_gib = tier_gib * context.spec.tensor_parallel_size
    arc_config = (
        ' --kv-transfer-config \'{"kv_connector": "OffloadingConnector", "kv_role": '
        '"kv_both", "kv_connector_extra_config": {"eviction_policy": "arc"}}\''
        if policy == "arc"
        else ""
    )
    return (
        f"vllm serve ... --kv-offloading-size {total_gib:.1f} "
        f"--kv-offloading-backend native{arc_config} "
        f"({tier_blocks:,} blocks of {context.block_size} tokens, "
        f"{context.spec.describe()}; the size is summed over tensor-parallel ranks)"
    )


def _tier_chart(context: RunContext, replays: TierReplays, recommended_gib: float) -> Chart:
    """Token hit ratio (GPU and tier together) against the tier's size, one line per policy;
    0 GiB is the GPU pool alone."""
    sizes = [0.0] + [
        gib_for_blocks(context.spec, context.block_size, size * (context.num_blocks - 1))
        for size in TIER_SIZES
    ]
    return Chart(
        kind="line",
        title="Token hit ratio by CPU tier size",
        x_title="CPU tier, GiB per GPU",
        y_title="token hit ratio",
        series=[
            Series(
                policy.upper(),
                sizes,
                [replays.lru.token_hit_ratio]
                + [replays.tiers[size, policy].token_hit_ratio for size in TIER_SIZES],
            )
            for policy in TIER_POLICIES
        ],
        markers={"recommended": recommended_gib},
    )


class TierPrice:
    """What a tier's hits move over PCIe and the prefill they save."""

    def __init__(self, context: RunContext, result: PolicyResult) -> None:
        self.model = CostModel()
        block_size = context.block_size
        bytes_moved = result.tier_hit_blocks * context.spec.bytes_per_block(block_size)
        self.gigabytes = bytes_moved / 1e9
        self.transfer_s = self.gigabytes / context.pcie_gb_per_s
        flops = self.model.block_flops(
            float(result.tier_hit_blocks), float(result.tier_hit_positions), block_size
        )
        self.compute_s = float(self.model.gpu_seconds(flops))
        requests = max(context.summary["requests"], 1)
        self.net_ttft_ms = (self.compute_s - self.transfer_s) / requests * 1000


def _size_lines(tiers: dict[tuple[int, str], PolicyResult]) -> list[str]:
    """One evidence line per tier size: the hit ratio under each of the tier's policies."""
    lines = []
    for size in TIER_SIZES:
        ratios = ", ".join(
            f"{policy.upper()} {tiers[size, policy].token_hit_ratio:.1%}"
            for policy in TIER_POLICIES
        )
        lines.append(f"with a CPU tier of {size}x the GPU pool: {ratios}")
    return lines
