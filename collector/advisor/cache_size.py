"""Cache size: the pool the sweep recommends, from the one-pass curve (and replays through vLLM).

The recommendation is the smallest pool that reaches TARGET_FRACTION of the hit ratio an
unlimited cache would give this run's requests (the one-pass curve's). With a what-if sweep
at hand (`kvscope whatif`) that reaches that pool, the replays through vLLM at the run's
block size decide instead; a sweep that stops short is said to, and decides nothing. Without
one, a run whose requests overlapped is replayed through vLLM's Scheduler at its own pool and
at the curve's (collector/advisor/scheduler_check.py), and those replays give the ratios; the
curve's are exact only for a run replayed one request at a time.

On a fleet the curve is each engine's own, summed (`RunContext.curve`): every size is a pool
per engine, exact for a fleet replayed one request at a time (an engine's pool sees only its
own requests); vLLM's Scheduler replays one engine, so it checks no fleet.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from collector.advisor.context import RunContext
from collector.advisor.miss_breakdown import quote_causes
from collector.advisor.scheduler_check import scheduler_check
from collector.advisor.suggestion import Chart, Series, Suggestion, severity_for_gain
from collector.model.kv_memory import blocks_for_gib, gib_for_blocks, vllm_pool_settings
from collector.model.mrc import MissRatioCurve
from collector.replay.sweep_results import SweepResult
from collector.safe_text import markdown_text

TARGET_FRACTION = 0.95
MEMORY_STEPS_GIB = (1, 2, 4, 8, 16)
SHRINK_LOSS = 0.005
MIN_GROW_GAIN = 0.005


class SizeSource(Enum):
    """What gave a recommendation's token hit ratios (`phrase_source` says it in words)."""

    CURVE = "curve"  # the one-pass curve of the run's block stream
    FLEET_CURVE = "fleet-curve"  # each engine's one-pass curve, summed over the fleet
    SCHEDULER = "scheduler"  # replays through vLLM's Scheduler at the run's arrival times
    WHATIF = "whatif"  # a what-if sweep's replays through vLLM


class SizeChange(Enum):
    """What the rule makes of a recommendation."""

    GROW = "grow"
    SHRINK = "shrink"
    KEEP = "keep"


CURVE_SOURCE = "one-pass curve of this run's block stream (one request at a time)"
FLEET_CURVE_SOURCE = (
    "one-pass curves of each engine's own block stream (one request at a time), summed over "
    "the fleet"
)
SCHEDULER_SOURCE = (
    "replays through vLLM's Scheduler at the run's arrival times "
    "(the one-pass curve picked the size)"
)


@dataclass(frozen=True)
class SizeRecommendation:
    """The pool the sweep recommends and the token hit ratios around it; `top_ratio` is an
    unlimited cache's, from the one-pass curve (a sweep's largest point is not unlimited);
    `short_sweep` says why the what-if replays did not decide, when they were given;
    `curve_note` why the curve's ratios stand unchecked by vLLM's Scheduler, when they do."""

    num_blocks: int
    ratio: float
    current_ratio: float
    top_ratio: float
    source: SizeSource
    replayed_sizes: int = 0  # the what-if sweep's pool sizes, where it decided
    short_sweep: str = ""
    curve_note: str = ""

    @property
    def gain(self) -> float:
        """Points of token hit ratio the recommended pool gains over the run's."""
        return self.ratio - self.current_ratio


def phrase_source(recommendation: SizeRecommendation) -> str:
    """The recommendation's source in words (evidence, effects, the JSON's figures)."""
    if recommendation.source is SizeSource.WHATIF:
        return f"what-if replays through vLLM ({recommendation.replayed_sizes} pool sizes)"
    return {
        SizeSource.CURVE: CURVE_SOURCE,
        SizeSource.FLEET_CURVE: FLEET_CURVE_SOURCE,
        SizeSource.SCHEDULER: SCHEDULER_SOURCE,
    }[recommendation.source]


def smallest_pool_reaching(curve: MissRatioCurve, ratio: float) -> int:
    """The smallest pool (null block included) whose token hit ratio reaches `ratio`."""
    token_ratios = curve.hit_blocks * curve.block_size / max(curve.prompt_tokens, 1)
    reached = np.flatnonzero(token_ratios >= ratio - 1e-12)
    usable = int(reached[0]) if reached.size else len(token_ratios) - 1
    return max(usable + 1, curve.min_num_blocks)


def recommend_size(context: RunContext) -> SizeRecommendation:
    """The smallest pool that reaches TARGET_FRACTION of what an unlimited cache gives, by
    the one-pass curve. What-if replays at the run's block size decide instead when the
    sweep reaches that pool, so that it covers where the curve flattens: then the smallest
    replayed pool within TARGET_FRACTION of the sweep's best. Otherwise replays through
    vLLM's Scheduler give the ratios at the run's pool and the curve's, where they apply."""
    curve = context.curve
    top = curve.token_hit_ratio(len(curve.hit_blocks) + 1)
    num_blocks = smallest_pool_reaching(curve, TARGET_FRACTION * top)
    replays = _replays_at_block_size(context)
    short_sweep = ""
    if replays:
        largest = max(replays, key=lambda row: row.num_blocks)
        if largest.num_blocks >= num_blocks:
            best = max(row.token_hit_ratio for row in replays)
            chosen = min(
                (row for row in replays if row.token_hit_ratio >= TARGET_FRACTION * best),
                key=lambda row: row.num_blocks,
            )
            return SizeRecommendation(
                num_blocks=chosen.num_blocks,
                ratio=chosen.token_hit_ratio,
                current_ratio=context.summary["token_hit_ratio"],
                top_ratio=top,
                source=SizeSource.WHATIF,
                replayed_sizes=len(replays),
            )
        short_sweep = (
            f"the what-if sweep stops at {largest.num_blocks:,} blocks "
            f"({largest.token_hit_ratio:.1%}), before the curve flattens: replay "
            f"{num_blocks:,} blocks or more to check this recommendation through vLLM"
        )
    return _checked(context, num_blocks, top, short_sweep)


def _checked(
    context: RunContext, num_blocks: int, top: float, short_sweep: str
) -> SizeRecommendation:
    """The curve's pick with the ratios of replays through vLLM's Scheduler at the run's
    pool and at the pick, where the run is replayed so; else the curve's, saying why."""
    check = scheduler_check(context, (context.num_blocks, num_blocks))
    if check.ratios:
        return SizeRecommendation(
            num_blocks=num_blocks,
            ratio=check.ratios[num_blocks],
            current_ratio=check.ratios[context.num_blocks],
            top_ratio=top,
            source=SizeSource.SCHEDULER,
            short_sweep=short_sweep,
        )
    return SizeRecommendation(
        num_blocks=num_blocks,
        ratio=context.curve.token_hit_ratio(num_blocks),
        current_ratio=context.curve.token_hit_ratio(context.num_blocks),
        top_ratio=top,
        source=SizeSource.CURVE if context.num_engines == 1 else SizeSource.FLEET_CURVE,
        short_sweep=short_sweep,
        curve_note=check.skipped,
    )


def _replays_at_block_size(context: RunContext) -> list[SweepResult]:
    return [row for row in context.whatif_rows if row.block_size == context.block_size]


def decide_change(recommendation: SizeRecommendation, current: int) -> SizeChange:
    """Grow to a larger pool that gains MIN_GROW_GAIN or more; shrink to one half the size
    or less that loses under SHRINK_LOSS; else keep the run's."""
    if recommendation.num_blocks > current and recommendation.gain >= MIN_GROW_GAIN:
        return SizeChange.GROW
    if recommendation.num_blocks * 2 <= current and recommendation.gain > -SHRINK_LOSS:
        return SizeChange.SHRINK
    return SizeChange.KEEP


def cache_size(context: RunContext) -> list[Suggestion]:
    """Suggest the recommended pool when it is larger than the run's (or much smaller)."""
    recommendation = recommend_size(context)
    change = decide_change(recommendation, context.num_blocks)
    if change is SizeChange.GROW:
        return [_grow(context, recommendation)]
    if change is SizeChange.SHRINK:
        return [_shrink(context, recommendation)]
    return []


def _grow(context: RunContext, recommendation: SizeRecommendation) -> Suggestion:
    spec, block_size, current = context.spec, context.block_size, context.num_blocks
    target, gain = recommendation.num_blocks, recommendation.gain
    source = phrase_source(recommendation)
    extra_gib = gib_for_blocks(spec, block_size, target - current)
    settings = vllm_pool_settings(
        spec,
        block_size,
        target,
        gib_for_blocks(spec, block_size, current),
        context.gpu,
        max_model_len=context.max_model_len,
    )
    gain_tokens = gain * context.prompt_tokens
    quote = quote_causes(context.miss_breakdown, "evicted", "preempted")
    return Suggestion(
        rule="cache-size",
        title=f"Grow the KV cache to {target:,} blocks{context.per_engine} "
        f"(+{extra_gib:.1f} GiB{context.per_engine})",
        severity=severity_for_gain(gain),
        evidence=[*_evidence(context, recommendation), *quote.lines],
        effect=(
            f"token hit ratio {recommendation.current_ratio:.1%} -> {recommendation.ratio:.1%} "
            f"(+{gain * 100:.1f} points, about {gain_tokens:,.0f} more prompt tokens served "
            f"from the cache over this run), per the {source}"
        ),
        action=_action(settings) + context.on_each_engine,
        gain_tokens=gain_tokens,
        figures={
            "current_num_blocks": current,
            "recommended_num_blocks": target,
            "extra_gib": round(extra_gib, 3),
            "current_token_hit_ratio": recommendation.current_ratio,
            "recommended_token_hit_ratio": recommendation.ratio,
            "unlimited_token_hit_ratio": recommendation.top_ratio,
            "source": source,
            **quote.figures,
        },
        charts=[curve_chart(context, recommendation)],
    )


def _shrink(context: RunContext, recommendation: SizeRecommendation) -> Suggestion:
    spec, block_size, current = context.spec, context.block_size, context.num_blocks
    target = recommendation.num_blocks
    freed_gib = gib_for_blocks(spec, block_size, current - target)
    loss = recommendation.current_ratio - recommendation.ratio
    return Suggestion(
        rule="cache-size",
        title="The KV cache is larger than this workload uses: "
        f"{target:,} blocks{context.per_engine} would do",
        severity="low",
        evidence=_evidence(context, recommendation),
        effect=(
            f"frees {freed_gib:.1f} GiB per GPU (for a larger batch or model) at a cost of "
            f"{loss * 100:.2f} points of token hit ratio, per the {phrase_source(recommendation)}"
        ),
        action=_action(
            vllm_pool_settings(
                spec,
                block_size,
                target,
                gib_for_blocks(spec, block_size, current),
                max_model_len=context.max_model_len,
            )
        )
        + context.on_each_engine,
        figures={"current_num_blocks": current, "recommended_num_blocks": target},
        charts=[curve_chart(context, recommendation)],
    )


def _action(settings: list[str]) -> str:
    """vLLM settings as the action: flags in backticks, notes as they are."""
    return " ".join(f"`{setting}`" if setting.startswith("--") else setting for setting in settings)


def _evidence(context: RunContext, recommendation: SizeRecommendation) -> list[str]:
    curve, spec, block_size = context.curve, context.spec, context.block_size
    current, per_engine = context.num_blocks, context.per_engine
    lines = [
        f"at the run's {current:,} blocks{per_engine} "
        f"({gib_for_blocks(spec, block_size, current):.1f} GiB) "
        f"the token hit ratio is {recommendation.current_ratio:.1%}; an unlimited cache would "
        f"give {recommendation.top_ratio:.1%} (one-pass curve); source: "
        f"{phrase_source(recommendation)}",
        f"{recommendation.num_blocks:,} blocks{per_engine} reach {recommendation.ratio:.1%}, "
        f"{TARGET_FRACTION:.0%} of what an unlimited cache gives",
        f"the run itself measured {context.summary['token_hit_ratio']:.1%} "
        f"({_concurrency(context)}); {_models(recommendation)}",
    ]
    lines += [note for note in (recommendation.short_sweep, recommendation.curve_note) if note]
    for gib in MEMORY_STEPS_GIB:
        extra = blocks_for_gib(spec, block_size, gib)
        ratio = curve.token_hit_ratio(current + extra)
        lines.append(
            f"+{gib} GiB of KV cache{per_engine} (+{extra:,} blocks) -> {ratio:.1%} "
            f"({(ratio - curve.token_hit_ratio(current)) * 100:+.1f} points)"
        )
    return lines


def _models(recommendation: SizeRecommendation) -> str:
    """What each source models of the run's timing."""
    if recommendation.source is SizeSource.SCHEDULER:
        return (
            "the Scheduler replays overlap its requests as they arrived; the one-pass curve "
            "(which picked the size, and gives the memory steps below) models one at a time"
        )
    if recommendation.source is SizeSource.FLEET_CURVE:
        return "the curves model one request at a time on each engine"
    return "the curve models one request at a time"


def _concurrency(context: RunContext) -> str:
    seqs = context.config["max_num_seqs"]
    timing = (
        "one request at a time"
        if seqs == 1
        else f"{markdown_text(context.config['timing'] or 'live')} timing, up to {seqs or '?'} "
        "requests at once"
    )
    return timing if context.num_engines == 1 else f"{context.num_engines} engines, {timing} each"


def curve_chart(context: RunContext, recommendation: SizeRecommendation) -> Chart:
    """The one-pass curve, the Scheduler replays' two points where they gave the ratios, and
    any what-if replays at the run's block size."""
    sizes, ratios = context.curve.points()
    series = [Series("one-pass curve", sizes.tolist(), ratios.tolist())]
    if recommendation.source is SizeSource.SCHEDULER:
        series.append(
            Series(
                "replays through vLLM's Scheduler",
                [context.num_blocks, recommendation.num_blocks],
                [recommendation.current_ratio, recommendation.ratio],
            )
        )
    replays = sorted(_replays_at_block_size(context), key=lambda row: row.num_blocks)
    if replays:
        series.append(
            Series(
                "what-if replays",
                [row.num_blocks for row in replays],
                [row.token_hit_ratio for row in replays],
            )
        )
    return Chart(
        kind="line",
        title=f"Token hit ratio by pool size{context.per_engine} (block size {context.block_size})",
        x_title=f"KV cache blocks{context.per_engine}",
        y_title="token hit ratio",
        series=series,
        markers={"current": context.num_blocks, "recommended": recommendation.num_blocks},
    )
