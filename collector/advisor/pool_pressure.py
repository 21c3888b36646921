"""Pool pressure: free blocks under 10 % for long stretches, and evictions that were regretted.

Both read the pool queries (`collector/queries/pool.py`); the cure for both is a larger pool
(the size the cache-size analysis recommends), or fewer requests running at once. On a fleet
the pool queries judge each engine's pool, and the sizes are per engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collector.advisor.cache_size import phrase_source, recommend_size
from collector.advisor.context import RunContext
from collector.advisor.miss_breakdown import quote_causes
from collector.advisor.suggestion import Chart, Series, Suggestion, severity_for_gain
from collector.model.kv_memory import gib_for_blocks
from collector.queries import pool
from collector.queries.timeline import time_span_ns

LONG_SHARE = 0.05  # of the run's time under the alarm line, in all
LONG_STRETCH_S = 30.0  # or one stretch this long
REGRET_SHARE = 0.20  # of evictions stored again later
MIN_REGRETS = 20


@dataclass(frozen=True)
class LowFreeStretches:
    """The stretches a run's pools spent under the alarm line of free blocks: their number,
    their total and the longest (and when it began), against the run's time (each engine's
    on a fleet)."""

    stretches: int
    span_s: float
    total_s: float
    longest_s: float
    longest_start_s: float

    @property
    def share(self) -> float:
        return self.total_s / self.span_s

    @property
    def long(self) -> bool:
        """Long enough to fire: LONG_SHARE of the run's time in all, or one LONG_STRETCH_S."""
        return self.share >= LONG_SHARE or self.longest_s >= LONG_STRETCH_S


def low_free_stretches(context: RunContext) -> LowFreeStretches | None:
    """The run's stretches under the alarm line; None if it never went under."""
    periods = pool.low_free_periods(context.run)
    if periods.empty:
        return None
    start_ns, end_ns = time_span_ns(context.run)
    durations = periods["end_s"] - periods["start_s"]
    longest = periods.iloc[int(durations.to_numpy().argmax())]
    return LowFreeStretches(
        stretches=len(periods),
        # A fleet's stretches are each engine's own: their share is of all engines' time.
        span_s=max((end_ns - start_ns) / 1e9, 1e-9) * context.num_engines,
        total_s=float(durations.sum()),
        longest_s=float(durations.max()),
        longest_start_s=float(longest["start_s"]),
    )


def low_free_blocks(context: RunContext) -> list[Suggestion]:
    """Fire when the pool ran under 10 % free for a long share of the run or a long stretch."""
    found = low_free_stretches(context)
    if found is None or not found.long:
        return []
    return [_low_free(context, found)]


def _low_free(context: RunContext, found: LowFreeStretches) -> Suggestion:
    seconds = "s" if context.num_engines == 1 else "engine-seconds"
    extremes = pool.free_block_extremes(context.run)
    seqs = context.config["max_num_seqs"]
    target = max(recommend_size(context).num_blocks, context.num_blocks * 3 // 2)
    extra_gib = gib_for_blocks(context.spec, context.block_size, target - context.num_blocks)
    return Suggestion(
        rule="low-free-blocks",
        title="The pool runs under 10 % free blocks for long stretches",
        severity="high" if context.summary["preemptions"] else "medium",
        evidence=[
            f"{found.total_s:.1f} {seconds} of {found.span_s:.1f} {seconds} ({found.share:.0%}) "
            f"under {pool.LOW_FREE_FRACTION:.0%} free, in {found.stretches} stretches; the "
            f"longest lasted {found.longest_s:.1f} s (from {found.longest_start_s:.1f} s)",
            f"fewest free blocks: {extremes['min_free_blocks']:,} of "
            f"{extremes['usable_blocks']:,}{context.per_engine}; "
            f"{context.summary['preemptions']:,} preemptions, "
            f"{context.summary['evictions']:,} evictions in the run",
        ],
        effect=(
            "running requests stop pushing out cached prefixes and stop being preempted "
            f"(recomputed from scratch); with {target:,} blocks{context.per_engine} the "
            "one-pass curve gives "
            f"{context.curve.token_hit_ratio(target):.1%} token hit ratio against "
            f"{context.curve.token_hit_ratio(context.num_blocks):.1%} now"
        ),
        action=(
            f"`--num-gpu-blocks-override {target}` (+{extra_gib:.1f} GiB), or fewer "
            f"requests at once: `--max-num-seqs {max((seqs or 2) // 2, 1)}`"
            + context.on_each_engine
        ),
        figures={
            "seconds_under_alarm": round(found.total_s, 3),
            "share_under_alarm": found.share,
            "longest_stretch_s": round(found.longest_s, 3),
            "stretches": found.stretches,
            **extremes,
        },
    )


def eviction_regret(context: RunContext) -> list[Suggestion]:
    """Fire when a large share of evicted blocks were stored again later (recomputed)."""
    summary = pool.eviction_regret_summary(context.run)
    if summary["restored"] < MIN_REGRETS or summary["regret_ratio"] < REGRET_SHARE:
        return []
    regret = pool.eviction_regret(context.run)
    delays_s = regret["restored_after_ns"].dropna().to_numpy(dtype=np.float64) / 1e9
    p50, p90 = np.percentile(delays_s, [50, 90])
    recommendation = recommend_size(context)
    current = context.num_blocks
    target = max(recommendation.num_blocks, current)
    # The cache-size rule's ratios (and source): both rules predict the same pool alike.
    before = recommendation.current_ratio
    after = recommendation.ratio if target == recommendation.num_blocks else before
    gain = after - before
    recomputed_tokens = summary["restored"] * context.block_size
    quote = quote_causes(context.miss_breakdown, "evicted", "preempted")
    return [
        Suggestion(
            rule="eviction-regret",
            title=f"{summary['regret_ratio']:.0%} of evicted blocks were needed again",
            severity=severity_for_gain(max(gain, context.share(recomputed_tokens))),
            evidence=[
                f"{summary['restored']:,} of {summary['evictions']:,} evictions were stored "
                f"again later ({recomputed_tokens:,} tokens recomputed)",
                f"time from eviction to re-store: median {p50:.1f} s, 90th percentile {p90:.1f} s",
                *_distance_lines(context),
                *quote.lines,
            ],
            effect=(
                f"with {target:,} blocks{context.per_engine} the regretted blocks mostly stay: "
                "token hit ratio "
                f"{before:.1%} -> {after:.1%}, per the {phrase_source(recommendation)}"
            ),
            action=f"`--num-gpu-blocks-override {target}`" + context.on_each_engine,
            gain_tokens=gain * context.prompt_tokens,
            figures={
                **summary,
                "median_restore_s": float(p50),
                "p90_restore_s": float(p90),
                **quote.figures,
            },
            charts=[_delay_chart(delays_s), _distance_chart(context)],
        )
    ]


def _distance_lines(context: RunContext) -> list[str]:
    """The reuse-distance distribution around the pool size, from the one-pass curve."""
    curve, current = context.curve, context.num_blocks
    here = curve.hits_at(current)
    lines = []
    for factor in (2, 4):
        more = curve.hits_at(current * factor) - here
        lines.append(
            f"{more:,.0f} block reuses have a reuse distance between {current:,} and "
            f"{current * factor:,} blocks (they hit with a {factor}x pool{context.per_engine})"
        )
    return lines


def _delay_chart(delays_s: np.ndarray) -> Chart:
    counts, edges = np.histogram(delays_s, bins=min(30, max(len(delays_s) // 5, 1)))
    return Chart(
        kind="bar",
        title="Evicted, then stored again: delay",
        x_title="seconds from eviction to re-store",
        y_title="blocks",
        series=[
            Series(
                "regretted evictions", (edges[:-1] + np.diff(edges) / 2).tolist(), counts.tolist()
            )
        ],
    )


def _distance_chart(context: RunContext) -> Chart:
    """Reuse distances: block hits gained per extra pool size, around the current pool."""
    curve, current = context.curve, context.num_blocks
    edges = np.unique(np.linspace(1, current * 4, 33).astype(np.int64))
    hits = np.array([curve.hits_at(int(edge)) for edge in edges])
    return Chart(
        kind="bar",
        title="Reuse distances of block reuses",
        x_title=f"reuse distance (blocks{context.per_engine})",
        y_title="block reuses",
        series=[Series("reuses", edges[1:].tolist(), np.diff(hits).tolist())],
        markers={"current pool": current},
    )
