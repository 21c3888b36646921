"""The report's miss breakdown: each run's prompt tokens per cause (docs/miss-causes.md), and
the miss cause whose share of the prompt tokens grew most from baseline to candidate.

Information, not a check: no threshold bounds a cause's share (docs/ci/thresholds.toml has
none), and the hit ratio checks already fail a candidate that misses more. The breakdown says
why it did. A run with no lookups (vLLM's KV events alone carry no requests) has none, and
the report says the breakdown is unavailable."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from collector.queries.miss_causes import CAUSE_NAMES, CAUSES, cause_totals
from collector.store.run_file import RunFile

SERVED = ("hit", "tier")  # not misses: no cause "grows" by them
MISS_CAUSES = tuple(cause for cause in CAUSES if cause not in SERVED)
NO_LOOKUPS = "the run has no lookups (a run of vLLM's KV events alone has no requests)"


@dataclass(frozen=True)
class MissBreakdown:
    """A run's prompt tokens per cause (every one of CAUSES), or why it has none."""

    tokens: dict[str, int] = field(default_factory=dict)
    unavailable: str | None = "not read from the run"

    @property
    def prompt_tokens(self) -> int:
        return sum(self.tokens.values())

    def share(self, cause: str) -> float:
        """The cause's share of the prompt tokens looked up."""
        return self.tokens.get(cause, 0) / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        """figures.json: per cause its tokens and share, or why there is no breakdown."""
        return {
            "unavailable": self.unavailable,
            "prompt_tokens": self.prompt_tokens,
            "causes": {
                cause: {"tokens": tokens, "share": self.share(cause)}
                for cause, tokens in self.tokens.items()
            },
        }


def read_breakdown(run: RunFile) -> MissBreakdown:
    """The run's breakdown over the whole run (`cause_totals`)."""
    totals = cause_totals(run)
    tokens = {
        str(cause): int(count)
        for cause, count in zip(totals["cause"], totals["tokens"], strict=True)
    }
    return MissBreakdown(tokens, None if sum(tokens.values()) else NO_LOOKUPS)


@dataclass(frozen=True)
class CauseGrowth:
    """The miss cause whose share of the prompt tokens grew most, in both runs."""

    cause: str
    baseline_share: float
    candidate_share: float
    baseline_tokens: int
    candidate_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "name": CAUSE_NAMES[self.cause],
            "baseline_share": self.baseline_share,
            "candidate_share": self.candidate_share,
            "baseline_tokens": self.baseline_tokens,
            "candidate_tokens": self.candidate_tokens,
        }


def grown_most(baseline: MissBreakdown, candidate: MissBreakdown) -> CauseGrowth | None:
    """The miss cause whose share grew most (ties: the first in CAUSES' order); None when no
    share grew or a run has no breakdown."""
    if baseline.unavailable or candidate.unavailable:
        return None
    growth = {cause: candidate.share(cause) - baseline.share(cause) for cause in MISS_CAUSES}
    cause = max(growth, key=lambda name: growth[name])
    if growth[cause] <= 0:
        return None
    return CauseGrowth(
        cause,
        baseline.share(cause),
        candidate.share(cause),
        baseline.tokens[cause],
        candidate.tokens[cause],
    )


def growth_line(baseline: MissBreakdown, candidate: MissBreakdown) -> str:
    """One sentence: which cause grew most (share of prompt tokens, tokens), or why none."""
    for label, run in (("baseline", baseline), ("candidate", candidate)):
        if run.unavailable:
            return f"miss causes: unavailable for the {label}: {run.unavailable}"
    growth = grown_most(baseline, candidate)
    if growth is None:
        return "miss causes: no miss cause grew in share of the prompt tokens"
    tokens = growth.candidate_tokens - growth.baseline_tokens
    return (
        f"miss causes: {CAUSE_NAMES[growth.cause]} grew most, "
        f"{_percent(growth.baseline_share)} -> {_percent(growth.candidate_share)} of prompt "
        f"tokens ({tokens:+,} tokens)"
    )


def cause_rows(baseline: MissBreakdown, candidate: MissBreakdown) -> list[tuple[str, ...]]:
    """Per cause either run has tokens of, in CAUSES' order: its name, each run's share and
    tokens, and the change in points; none when a run has no breakdown."""
    rows: list[tuple[str, ...]] = []
    if baseline.unavailable or candidate.unavailable:
        return rows
    for cause in CAUSES:
        old, new = baseline.tokens.get(cause, 0), candidate.tokens.get(cause, 0)
        if not old and not new:
            continue
        change = (candidate.share(cause) - baseline.share(cause)) * 100
        rows.append(
            (
                CAUSE_NAMES[cause],
                f"{_percent(baseline.share(cause))} ({old:,})",
                f"{_percent(candidate.share(cause))} ({new:,})",
                f"{change:+.1f} pts",
            )
        )
    return rows


def _percent(share: float) -> str:
    return f"{share * 100:.1f} %"
