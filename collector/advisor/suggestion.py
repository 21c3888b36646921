"""What the advisor hands out: suggestions with evidence, predicted effect and the exact action."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SEVERITIES = ("high", "medium", "low")
# The x title of a chart over the run's time, seconds from its first record (the app puts a
# run longer than a day on the wall clock).
TIME_TITLE = "time (s)"


@dataclass(frozen=True)
class Series:
    """One line or set of bars of a chart."""

    name: str
    x: list[Any]
    y: list[float]


@dataclass(frozen=True)
class Chart:
    """The data behind a suggestion's chart; the app draws it (`kind`: line or bar)."""

    kind: str
    title: str
    x_title: str
    y_title: str
    series: list[Series]
    markers: dict[str, float] = field(default_factory=dict)  # label -> x


@dataclass(frozen=True)
class Suggestion:
    """One thing to change, why (evidence), what it buys (effect) and how (action)."""

    rule: str
    title: str
    severity: str
    evidence: list[str]
    effect: str
    action: str
    gain_tokens: float = 0.0  # predicted extra prefix-hit tokens over the run (ranking)
    figures: dict[str, Any] = field(default_factory=dict)
    charts: list[Chart] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RuleOutcome:
    """What one rule concluded: fired, silent (nothing to fix) or skipped (and why)."""

    rule: str
    status: str
    detail: str


class NotApplicable(Exception):
    """A rule cannot judge this run; the message says why and what would let it."""


class NothingToWin(Exception):
    """A rule judged the run and suggests nothing; the message says what it found."""


def severity_for_gain(gain_share: float) -> str:
    """Efficiency suggestions: high from 5 points of token hit ratio, medium from 1."""
    if gain_share >= 0.05:
        return "high"
    return "medium" if gain_share >= 0.01 else "low"
