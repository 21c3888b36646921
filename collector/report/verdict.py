"""A baseline run against a candidate run: figures, checks, verdict and notes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from collector.model.comparison import RUN_SETTINGS, differing_settings
from collector.report.checks import Check, failed, run_checks
from collector.report.figures import RunFigures
from collector.report.miss_breakdown import grown_most, growth_line
from collector.report.thresholds import Thresholds
from collector.safe_text import shown

REPORT_FORMAT = 1


@dataclass(frozen=True)
class Comparison:
    """Everything the report's outputs show, computed once."""

    baseline: RunFigures
    candidate: RunFigures
    checks: list[Check]
    thresholds: Thresholds
    thresholds_source: str
    notes: list[str]

    @property
    def regressed(self) -> list[Check]:
        return failed(self.checks)

    @property
    def verdict(self) -> str:
        return "regression" if self.regressed else "pass"

    @property
    def miss_line(self) -> str:
        """Which miss cause grew most, in one sentence (information, not a check)."""
        return growth_line(self.baseline.misses, self.candidate.misses)

    def miss_causes(self) -> dict[str, Any]:
        """figures.json's comparison of the breakdowns: the cause that grew most (None: none
        grew, or a run has no breakdown) and the sentence the report prints."""
        growth = grown_most(self.baseline.misses, self.candidate.misses)
        return {
            "grew_most": None if growth is None else growth.to_dict(),
            "summary": self.miss_line,
        }

    def to_dict(self) -> dict[str, Any]:
        """figures.json: every figure of both runs, every check, the thresholds used."""
        return {
            "report_format": REPORT_FORMAT,
            "verdict": self.verdict,
            "regressed": [check.name for check in self.regressed],
            "checks": [check.to_dict() for check in self.checks],
            "notes": self.notes,
            "thresholds": {"source": self.thresholds_source, **self.thresholds.to_dict()},
            "miss_causes": self.miss_causes(),
            "baseline": self.baseline.to_dict(),
            "candidate": self.candidate.to_dict(),
        }


def compare(
    baseline: RunFigures, candidate: RunFigures, thresholds: Thresholds, thresholds_source: str
) -> Comparison:
    """Run every check and note what makes the two runs differ besides their results."""
    checks = run_checks(baseline, candidate, thresholds)
    notes = _notes(baseline, candidate)
    return Comparison(baseline, candidate, checks, thresholds, thresholds_source, notes)


def _notes(baseline: RunFigures, candidate: RunFigures) -> list[str]:
    notes = []
    for name in differing_settings(baseline.config, candidate.config, RUN_SETTINGS):
        first, second = shown(baseline.config.get(name)), shown(candidate.config.get(name))
        notes.append(f"{name} differs: {first} in the baseline, {second} in the candidate.")
    # Read by name: the same few lines for each figure.
    old: Mapping[str, Any] = baseline.summary
    new: Mapping[str, Any] = candidate.summary
    for name, meaning in (
        ("requests", "the runs replayed different workloads"),
        ("prompt_tokens", "the prompts changed"),
    ):
        if old[name] != new[name]:
            notes.append(
                f"{name} differs: {old[name]:,} in the baseline, {new[name]:,} in the "
                f"candidate ({meaning})."
            )
    for name in ("dropped_events", "collisions"):
        if old[name]:
            notes.append(f"The baseline has {old[name]:,} {name.replace('_', ' ')}.")
    return notes
