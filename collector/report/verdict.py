"""A baseline run against a candidate run: figures, checks, verdict and notes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from collector.model.comparison import RUN_SETTINGS, differing_settings
from collector.report.checks import Check, failed, run_checks
from collector.report.figures import RunFigures
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

    def to_dict(self) -> dict[str, Any]:
        """figures.json: every figure of both runs, every check, the thresholds used."""
        return {
            "report_format": REPORT_FORMAT,
            "verdict": self.verdict,
            "regressed": [check.name for check in self.regressed],
            "checks": [check.to_dict() for check in self.checks],
            "notes": self.notes,
            "thresholds": {"source": self.thresholds_source, **self.thresholds.to_dict()},
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
    old, new = baseline.summary, candidate.summary
    for name, before, after, meaning in (
        ("requests", old["requests"], new["requests"], "the runs replayed different workloads"),
        ("prompt_tokens", old["prompt_tokens"], new["prompt_tokens"], "the prompts changed"),
    ):
        if before != after:
            notes.append(
                f"{name} differs: {before:,} in the baseline, {after:,} in the candidate "
                f"({meaning})."
            )
    for what, count in (
        ("dropped events", old["dropped_events"]),
        ("collisions", old["collisions"]),
    ):
        if count:
            notes.append(f"The baseline has {count:,} {what}.")
    return notes
