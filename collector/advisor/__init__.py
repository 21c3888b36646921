"""The tuning advisor: rules over one run, each suggestion with evidence, effect and action."""

from __future__ import annotations

from collector.advisor.context import RunContext
from collector.advisor.ranking import RULES, Advice, advise
from collector.advisor.suggestion import Chart, NotApplicable, RuleOutcome, Series, Suggestion

__all__ = [
    "RULES",
    "Advice",
    "Chart",
    "NotApplicable",
    "RuleOutcome",
    "RunContext",
    "Series",
    "Suggestion",
    "advise",
]
