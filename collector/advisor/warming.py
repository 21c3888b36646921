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

from collector import queries
from collector.advisor.context import RunContext
from collector.advisor.dynamic_field import family_label
from collector.advisor.run_queries import eviction_times, first_block_references
from collector.advisor.suggestion import Chart, Series, Suggestion, severity_for_gain

MIN_HITS = 5
MIN_IDLE_MISSES = 2
IDLE_FACTOR = 4.0  # a miss after a gap this many times the prefix's usual gap between uses


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
    return sorted(found, key=lambda prefix: prefix.idle_misses * prefix.prefix_tokens, reverse=True)


def warming(context: RunContext) -> list[Suggestion]:
    """One suggestion per hot prefix that misses after idle spells."""
    references = first_block_references(context.connection)
    return [
        _suggestion(context, prefix, references[references["block_hash"] == prefix.block_hash])
        for prefix in hot_prefixes_missing_after_idle(references)
    ]


def _suggestion(context: RunContext, prefix: HotPrefix, uses: pd.DataFrame) -> Suggestion:
    survival_s = _idle_survival_s(context, prefix.block_hash, uses)
    interval_s = max(survival_s / 2, prefix.usual_gap_s) if survival_s else prefix.usual_gap_s
    saved = prefix.idle_misses * prefix.prefix_tokens
    owner = f" of tenant {prefix.tenant}" if prefix.tenant else ""
    return Suggestion(
        rule="warm-prefix",
        title=f"Keep the hot `{prefix.label}` prefix{owner} warm",
        severity=severity_for_gain(context.share(saved)),
        evidence=[
            f"{prefix.uses} requests start with this {prefix.prefix_tokens}-token prefix "
            f"(first block hash {prefix.block_hash:#018x}); {prefix.hits} hit it",
            f"{prefix.idle_misses} requests recomputed it after idle gaps of "
            + ", ".join(f"{gap:.1f} s" for gap in prefix.idle_gaps_s[:6])
            + f" (it is usually used every {prefix.usual_gap_s:.2f} s)",
            (
                f"idle, it stayed cached {survival_s:.1f} s (median, from last use to eviction)"
                if survival_s
                else "its evictions were not recorded in this run"
            ),
        ],
        effect=(
            f"about {saved:,} prompt tokens not recomputed over this run "
            f"(+{context.share(saved) * 100:.1f} points of token hit ratio), for one "
            "one-token request per interval while the prefix is idle"
        ),
        action=(
            f"while no `{prefix.label}` request arrives, send its first {prefix.prefix_tokens} "
            f"tokens with `max_tokens=1` every {interval_s:.1f} s (same adapter and "
            "cache_salt as the real requests)"
        ),
        gain_tokens=float(saved),
        figures={
            "block_hash": prefix.block_hash,
            "idle_misses": prefix.idle_misses,
            "prefix_tokens": prefix.prefix_tokens,
            "warm_interval_s": round(interval_s, 3),
        },
        charts=[_uses_chart(context, uses, prefix.label)],
    )


def _idle_survival_s(context: RunContext, block_hash: int, uses: pd.DataFrame) -> float:
    """Median time from the prefix's last use to its eviction."""
    evictions = eviction_times(context.connection, [block_hash])
    use_times = uses["ts_ns"].to_numpy()
    survivals = []
    for evicted_ns in evictions["ts_ns"]:
        before = use_times[use_times <= evicted_ns]
        if before.size:
            survivals.append((evicted_ns - before[-1]) / 1e9)
    return float(np.median(survivals)) if survivals else 0.0


def _uses_chart(context: RunContext, uses: pd.DataFrame, label: str) -> Chart:
    start_ns, _ = queries.time_span_ns(context.connection)
    series = []
    for kind, name in (("hit", "hit"), ("store", "recomputed")):
        chosen = uses[uses["kind"] == kind]
        times = ((chosen["ts_ns"] - start_ns) / 1e9).tolist()
        series.append(Series(name, times, [1.0 if kind == "hit" else 0.0] * len(times)))
    return Chart(
        kind="scatter",
        title=f"{label} prefix: uses over time (1 = hit, 0 = recomputed)",
        x_title="time (s)",
        y_title="hit",
        series=series,
    )
