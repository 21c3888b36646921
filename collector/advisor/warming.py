"""Hot prefixes that miss after idle periods: candidates for warming.

A prefix many requests hit (their first block) that is evicted while nobody uses it, and
recomputed by the first request after the quiet spell. Sending a one-token request with the
prefix now and then keeps it cached. Read from the run's own events: first-block hits and
stores, and the evictions of those blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from collector.advisor.context import RunContext
from collector.advisor.dynamic_field import family_label
from collector.advisor.suggestion import TIME_TITLE, Chart, Series, Suggestion, severity_for_gain
from collector.queries.pool import eviction_times
from collector.queries.requests import first_block_references
from collector.queries.timeline import time_span_ns
from collector.safe_text import code

MIN_HITS = 5
MIN_IDLE_MISSES = 2
IDLE_FACTOR = 4.0  # a miss after a gap this many times the prefix's usual gap between uses
MIN_SHARE = 0.001  # of the run's prompt tokens recomputed after idle spells, per prefix
SHOWN = 5


@dataclass(frozen=True)
class HotPrefix:
    """A first block many requests share, and its misses after idle spells."""

    block_hash: int
    label: str
    tenant: str | None
    uses: int
    hits: int
    idle_misses: int
    idle_gaps_s: list[float]
    prefix_tokens: int
    usual_gap_s: float

    @property
    def idle_tokens(self) -> int:
        """Prompt tokens recomputed after its idle spells."""
        return self.idle_misses * self.prefix_tokens


@dataclass(frozen=True)
class WarmPlan:
    """A prefix to keep warm: how long it survives idle (median from its last use to its
    eviction; 0 where its evictions were not recorded), and how often to warm it."""

    prefix: HotPrefix
    survival_s: float
    interval_s: float


def hot_prefixes_missing_after_idle(references: pd.DataFrame) -> list[HotPrefix]:
    """Hot first blocks with at least MIN_IDLE_MISSES misses after long idle gaps, from
    `first_block_references`."""
    found = []
    for _, uses in references.groupby("block_hash", sort=False):
        hits = uses[uses["kind"] == "hit"]
        if len(hits) < MIN_HITS:
            continue
        times_s = uses["ts_ns"].to_numpy(dtype=np.float64) / 1e9
        gaps = np.diff(times_s)
        is_hit = (uses["kind"] == "hit").to_numpy()[1:]
        usual = float(np.median(gaps[is_hit])) if is_hit.any() else 0.0
        idle = ~is_hit & (gaps > max(IDLE_FACTOR * usual, 1e-3))
        if idle.sum() < MIN_IDLE_MISSES:
            continue
        found.append(
            HotPrefix(
                block_hash=int(uses["block_hash"].iloc[0]),
                label=family_label(uses["request_id"].tolist()),
                tenant=uses["tenant"].iloc[0],
                uses=len(uses),
                hits=len(hits),
                idle_misses=int(idle.sum()),
                idle_gaps_s=gaps[idle].tolist(),
                prefix_tokens=int(np.median(hits["num_hit_tokens"])),
                usual_gap_s=usual,
            )
        )
    return sorted(found, key=lambda prefix: prefix.idle_tokens, reverse=True)


def warming(context: RunContext) -> list[Suggestion]:
    """One suggestion for the hot prefixes whose idle misses cost at least MIN_SHARE."""
    references = first_block_references(context.run)
    candidates = [
        prefix
        for prefix in hot_prefixes_missing_after_idle(references)
        if context.share(prefix.idle_tokens) >= MIN_SHARE
    ]
    if not candidates:
        return []
    return [_suggestion(context, references, _plans(context, references, candidates))]


def _plans(
    context: RunContext, references: pd.DataFrame, candidates: list[HotPrefix]
) -> list[WarmPlan]:
    """Per prefix: how long it survives idle, and how often to warm it (half of that, but
    never more often than it is used anyway)."""
    plans = []
    for prefix in candidates:
        uses = references[references["block_hash"] == prefix.block_hash]
        survival_s = _idle_survival_s(context, prefix.block_hash, uses)
        interval_s = max(survival_s / 2, prefix.usual_gap_s) if survival_s else prefix.usual_gap_s
        plans.append(WarmPlan(prefix, survival_s, interval_s))
    return plans


def _suggestion(context: RunContext, references: pd.DataFrame, plans: list[WarmPlan]) -> Suggestion:
    top = plans[0].prefix
    saved = sum(plan.prefix.idle_tokens for plan in plans)
    shown = plans[:SHOWN]
    more = [f"and {len(plans) - SHOWN} more"] if len(plans) > SHOWN else []
    return Suggestion(
        rule="warm-prefix",
        title=f"Keep the hot `{top.label}` prefix warm"
        if len(plans) == 1
        else f"Keep {len(plans)} hot prefixes warm",
        severity=severity_for_gain(context.share(saved)),
        evidence=[_evidence_line(plan.prefix, plan.survival_s) for plan in shown] + more,
        effect=(
            f"about {saved:,} prompt tokens not recomputed over this run "
            f"(+{context.share(saved) * 100:.1f} points of token hit ratio), for one "
            "one-token request per interval while a prefix is idle; warming keeps these "
            "blocks cached at the expense of colder ones, which this estimate does not count"
        ),
        action="; ".join(
            f"while no request with prefix {plan.prefix.block_hash:#018x} "
            f"(`{plan.prefix.label}`) arrives, send its first {plan.prefix.prefix_tokens} "
            f"tokens with `max_tokens=1` every {plan.interval_s:.1f} s"
            for plan in shown
        )
        + " (same adapter and cache_salt as the real requests)",
        gain_tokens=float(saved),
        figures={
            "prefixes": [
                {
                    "block_hash": plan.prefix.block_hash,
                    "label": plan.prefix.label,
                    "idle_misses": plan.prefix.idle_misses,
                    "prefix_tokens": plan.prefix.prefix_tokens,
                    "warm_interval_s": round(plan.interval_s, 3),
                }
                for plan in plans
            ]
        },
        charts=[
            _uses_chart(context, references[references["block_hash"] == top.block_hash], top.label)
        ],
    )


def _evidence_line(prefix: HotPrefix, survival_s: float) -> str:
    owner = f" of tenant {code(prefix.tenant)}" if prefix.tenant else ""
    stays = (
        f"idle, it stays cached {survival_s:.1f} s (median from last use to eviction)"
        if survival_s
        else "its evictions were not recorded"
    )
    return (
        f"`{prefix.label}`{owner}: {prefix.uses} requests start with this "
        f"{prefix.prefix_tokens}-token prefix (first block {prefix.block_hash:#018x}), "
        f"{prefix.hits} hit it, {prefix.idle_misses} recomputed it after idle gaps of "
        + ", ".join(f"{gap:.1f} s" for gap in prefix.idle_gaps_s[:4])
        + f" (it is usually used every {prefix.usual_gap_s:.2f} s); {stays}"
    )


def _idle_survival_s(context: RunContext, block_hash: int, uses: pd.DataFrame) -> float:
    """Median time from the prefix's last use to its eviction."""
    evictions = eviction_times(context.run, [block_hash])
    use_times = uses["ts_ns"].to_numpy()
    survivals = []
    for evicted_ns in evictions["ts_ns"]:
        before = use_times[use_times <= evicted_ns]
        if before.size:
            survivals.append((evicted_ns - before[-1]) / 1e9)
    return float(np.median(survivals)) if survivals else 0.0


def _uses_chart(context: RunContext, uses: pd.DataFrame, label: str) -> Chart:
    start_ns, _ = time_span_ns(context.run)
    series = []
    for kind, name in (("hit", "hit"), ("store", "recomputed")):
        chosen = uses[uses["kind"] == kind]
        times = ((chosen["ts_ns"] - start_ns) / 1e9).tolist()
        series.append(Series(name, times, [1.0 if kind == "hit" else 0.0] * len(times)))
    return Chart(
        kind="scatter",
        title=f"{label} prefix: uses over time (1 = hit, 0 = recomputed)",
        x_title=TIME_TITLE,
        y_title="hit",
        series=series,
    )
