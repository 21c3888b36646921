"""A baseline run against a candidate run: figures, checks, verdict and notes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from collector.report.checks import Check, failed, run_checks
from collector.report.figures import RunFigures
from collector.report.thresholds import Thresholds

REPORT_FORMAT = 1
SETTINGS = ("block_size", "num_blocks", "hash_algo", "timing", "max_num_seqs")


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
    for name in SETTINGS:
        old, new = baseline.config.get(name), candidate.config.get(name)
        if old != new:
            notes.append(f"{name} differs: {old} in the baseline, {new} in the candidate.")
    for name, meaning in (
        ("requests", "the runs replayed different workloads"),
        ("prompt_tokens", "the prompts changed"),
    ):
        old, new = baseline.summary[name], candidate.summary[name]
        if old != new:
            notes.append(
                f"{name} differs: {old:,} in the baseline, {new:,} in the candidate ({meaning})."
            )
    for name in ("dropped_events", "collisions"):
        if baseline.summary[name]:
            notes.append(f"The baseline has {baseline.summary[name]:,} {name.replace('_', ' ')}.")
    return notes
