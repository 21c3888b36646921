"""How the report writes numbers: the same text in Markdown, HTML and JUnit."""

from __future__ import annotations

from collector.report.checks import Check

MISSING = "-"


def format_value(value: float | None, unit: str) -> str:
    """A ratio as a percentage, a count with thousands separators, a rate with 2 decimals."""
    if value is None:
        return MISSING
    if unit == "ratio":
        return f"{value * 100:.1f} %"
    if unit == "count":
        return f"{value:,.0f}"
    return f"{value:.2f}"


def format_change(check: Check) -> str:
    """Candidate against baseline: points for ratios, a relative change otherwise."""
    if check.baseline is None or check.candidate is None:
        return MISSING
    difference = check.candidate - check.baseline
    if check.unit == "ratio":
        return f"{difference * 100:+.1f} pts"
    if check.baseline == 0:
        return "0" if difference == 0 else f"{difference:+,.2f}".rstrip("0").rstrip(".")
    return f"{difference / check.baseline * 100:+.1f} %"


def format_limit(check: Check) -> str:
    """The bound the candidate had to keep, as `≥ 44.6 %` or `≤ 0`."""
    if check.limit is None:
        return MISSING
    sign = "≥" if check.bound == "min" else "≤"
    return f"{sign} {format_value(check.limit, check.unit)}"


def describe(check: Check) -> str:
    """One sentence for a check: its values, or why it was skipped."""
    if check.status == "skip":
        return f"{check.title}: skipped, {check.reason}"
    return (
        f"{check.title}: candidate {format_value(check.candidate, check.unit)}, "
        f"baseline {format_value(check.baseline, check.unit)}, "
        f"limit {format_limit(check)} ({check.status})"
    )
