"""Every rule, run in turn, and the suggestions ranked: severity first, then tokens gained;
suggestions that turn the same vLLM flag merged into the first of them."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from collector.advisor.block_size import block_size
from collector.advisor.cache_policy import cache_policy
from collector.advisor.cache_size import cache_size
from collector.advisor.context import RunContext
from collector.advisor.cpu_tier import cpu_tier
from collector.advisor.dynamic_field import dynamic_field
from collector.advisor.hash_algo import hash_algorithm
from collector.advisor.hybrid_alignment import hybrid_alignment
from collector.advisor.lora import lora_split
from collector.advisor.pool_pressure import eviction_regret, low_free_blocks
from collector.advisor.routing import routing
from collector.advisor.suggestion import (
    SEVERITIES,
    NotApplicable,
    NothingToWin,
    RuleOutcome,
    Suggestion,
)
from collector.advisor.tenant_isolation import per_request_salts, shared_across_tenants
from collector.advisor.warming import warming

Rule = Callable[[RunContext], list[Suggestion]]

RULES: tuple[tuple[str, Rule], ...] = (
    ("cache-size", cache_size),
    ("low-free-blocks", low_free_blocks),
    ("eviction-regret", eviction_regret),
    ("block-size", block_size),
    ("dynamic-field", dynamic_field),
    ("per-request-salt", per_request_salts),
    ("cross-tenant-sharing", shared_across_tenants),
    ("hash-algorithm", hash_algorithm),
    ("lora-split", lora_split),
    ("warm-prefix", warming),
    ("cache-policy", cache_policy),
    ("cpu-tier", cpu_tier),
    ("routing", routing),
    ("hybrid-alignment", hybrid_alignment),
)


@dataclass(frozen=True)
class Advice:
    """The ranked suggestions for one run, and what every rule concluded."""

    suggestions: list[Suggestion]
    checks: list[RuleOutcome]


def rank(suggestions: list[Suggestion]) -> list[Suggestion]:
    """Severity first (high, medium, low), then the predicted tokens gained."""
    return sorted(
        suggestions,
        key=lambda suggestion: (SEVERITIES.index(suggestion.severity), -suggestion.gain_tokens),
    )


# The flag an action leads with, after a note in parentheses (a pool no memory share holds).
_LEADING_FLAG = re.compile(r"(?:\([^)]*\)\s*)?`?(--[a-z][a-z0-9-]*)")
# Flags that turn the same knob: the memory share and the block count both size the pool.
_KNOBS = {"--gpu-memory-utilization": "--num-gpu-blocks-override"}


def merge_same_flag(ranked: list[Suggestion]) -> list[Suggestion]:
    """One suggestion per vLLM knob: a later suggestion whose action leads with the flag an
    earlier one leads with (or one that turns the same knob: the pool's size) is folded into
    that one (its title and evidence as evidence, its charts after the first's, its rule in
    `figures["merged_rules"]`; an evidence line it already has, such as the miss breakdown's
    quote, is not repeated). An action that leads with something else (a prompt change,
    routing; a flag only as its fallback) is never merged."""
    merged: list[Suggestion] = []
    by_flag: dict[str, int] = {}
    for suggestion in ranked:
        leading = _LEADING_FLAG.match(suggestion.action)
        flag = _KNOBS.get(leading.group(1), leading.group(1)) if leading else None
        if flag is None or flag not in by_flag:
            if flag is not None:
                by_flag[flag] = len(merged)
            merged.append(suggestion)
            continue
        index = by_flag[flag]
        first = merged[index]
        merged[index] = replace(
            first,
            evidence=[
                *first.evidence,
                f"also from rule `{suggestion.rule}`: {suggestion.title}; it suggests "
                f"{suggestion.action}",
                *(line for line in suggestion.evidence if line not in first.evidence),
            ],
            charts=[*first.charts, *suggestion.charts],
            figures={
                **first.figures,
                "merged_rules": [*first.figures.get("merged_rules", []), suggestion.rule],
            },
        )
    return merged


def advise(
    context: RunContext,
    rules: tuple[tuple[str, Rule], ...] = RULES,
    *,
    checked: Callable[[RuleOutcome], None] = lambda _: None,
) -> Advice:
    """Run every rule on the run; a rule that cannot judge it is reported as skipped.
    `checked` is told each rule's outcome as it comes (`kvscope advise` prints them)."""
    suggestions: list[Suggestion] = []
    checks = []
    for name, rule in rules:
        found, outcome = _check(name, rule, context)
        suggestions += found
        checks.append(outcome)
        checked(outcome)
    return Advice(merge_same_flag(rank(suggestions)), checks)


def _check(name: str, rule: Rule, context: RunContext) -> tuple[list[Suggestion], RuleOutcome]:
    """One rule's suggestions and what it concluded."""
    try:
        found = rule(context)
    except NotApplicable as reason:
        return [], RuleOutcome(name, "skipped", str(reason))
    except NothingToWin as found_nothing:
        return [], RuleOutcome(name, "silent", str(found_nothing))
    if found:
        return found, RuleOutcome(
            name, "fired", "; ".join(suggestion.title for suggestion in found)
        )
    return [], RuleOutcome(name, "silent", "nothing to suggest")
