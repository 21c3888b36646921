"""The report's checks: pure functions from two runs' figures and the thresholds to verdicts.

Every check judges the candidate. A check is named by a stable id (`token_hit_ratio`,
`tenant_hit_ratio[acme]`, ...) that the Markdown, the JUnit file and figures.json share.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from collector.queries.tenants import tenant_label
from collector.report.figures import RunFigures
from collector.report.thresholds import PerRequestLimit, RatioLimit, Thresholds

PASS, FAIL, SKIP = "pass", "fail", "skip"
_DISABLED = "disabled in the thresholds file"


@dataclass(frozen=True)
class Check:
    """One check's verdict: the candidate must stay at or above (`min`) or at or below
    (`max`) the limit derived from the baseline and the thresholds."""

    name: str
    title: str
    unit: str  # "ratio", "count" or "per_request"
    status: str
    baseline: float | None = None
    candidate: float | None = None
    limit: float | None = None
    bound: str = "min"
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_checks(baseline: RunFigures, candidate: RunFigures, thresholds: Thresholds) -> list[Check]:
    """Every check, in the report's order; tenant checks last, sorted by tenant."""
    return [
        _ratio_check(
            "token_hit_ratio",
            "token hit ratio",
            baseline.summary["token_hit_ratio"],
            candidate.summary["token_hit_ratio"],
            thresholds.token_hit_ratio,
        ),
        _ratio_check(
            "block_hit_ratio",
            "block hit ratio",
            baseline.summary["block_hit_ratio"],
            candidate.summary["block_hit_ratio"],
            thresholds.block_hit_ratio,
        ),
        _tokens_saved_check(baseline, candidate, thresholds),
        _evictions_check(baseline, candidate, thresholds),
        _regret_check(baseline, candidate, thresholds),
        _ratio_check(
            "min_free_blocks",
            "fewest free blocks, as a share of the pool",
            baseline.min_free_share,
            candidate.min_free_share,
            thresholds.min_free_blocks,
        ),
        _pool_empty_check(baseline, candidate, thresholds),
        _per_request_check(
            "preemptions_per_request",
            "preemptions per request",
            baseline.preemptions_per_request,
            candidate.preemptions_per_request,
            thresholds.preemptions_per_request,
            requests=int(candidate.summary["requests"]),
        ),
        # Any collision is a wrong reuse (another prompt's KV served): always a failure.
        _summary_count_check("collisions", "hash collisions", baseline, candidate, most=0),
        _summary_count_check(
            "dropped_events",
            "events lost by the recorder",
            baseline,
            candidate,
            most=thresholds.dropped_events.max,
            enabled=thresholds.dropped_events.enabled,
        ),
        *_tenant_checks(baseline, candidate, thresholds),
    ]


def failed(checks: list[Check]) -> list[Check]:
    return [check for check in checks if check.status == FAIL]


def _judge(
    name: str,
    title: str,
    unit: str,
    *,
    baseline: float,
    candidate: float,
    limit: float,
    bound: str,
    enabled: bool = True,
) -> Check:
    """A check that passes when the candidate is on the right side of the limit."""
    if not enabled:
        status, reason = SKIP, _DISABLED
    elif bound == "min":
        status, reason = (PASS, "") if candidate >= limit else (FAIL, "under the limit")
    else:
        status, reason = (PASS, "") if candidate <= limit else (FAIL, "over the limit")
    return Check(name, title, unit, status, baseline, candidate, limit, bound, reason)


def _ratio_check(
    name: str, title: str, baseline: float, candidate: float, limit: RatioLimit
) -> Check:
    return _judge(
        name,
        title,
        "ratio",
        baseline=baseline,
        candidate=candidate,
        limit=max(baseline - limit.max_drop, limit.min),
        bound="min",
        enabled=limit.enabled,
    )


def _tokens_saved_check(
    baseline: RunFigures, candidate: RunFigures, thresholds: Thresholds
) -> Check:
    limit = thresholds.tokens_saved
    saved = baseline.summary["hit_tokens"]
    return _judge(
        "tokens_saved",
        "prompt tokens served from the cache",
        "count",
        baseline=saved,
        candidate=candidate.summary["hit_tokens"],
        limit=min(saved * (1 - limit.max_relative_drop), saved - limit.min_drop),
        bound="min",
        enabled=limit.enabled,
    )


def _evictions_check(baseline: RunFigures, candidate: RunFigures, thresholds: Thresholds) -> Check:
    """Evictions per request; between runs of different block sizes, evicted tokens per
    request (evictions x block size), since twice the block size alone halves evictions."""
    block_sizes = int(baseline.summary["block_size"]), int(candidate.summary["block_size"])
    if block_sizes[0] == block_sizes[1]:
        return _per_request_check(
            "evictions_per_request",
            "evictions per request",
            baseline.evictions_per_request,
            candidate.evictions_per_request,
            thresholds.evictions_per_request,
            requests=int(candidate.summary["requests"]),
        )
    return _per_request_check(
        "evictions_per_request",
        "evicted tokens per request (evictions x block size: the block sizes differ)",
        baseline.evictions_per_request * block_sizes[0],
        candidate.evictions_per_request * block_sizes[1],
        thresholds.evictions_per_request,
        requests=int(candidate.summary["requests"]),
        unit_scale=block_sizes[0],
    )


def _per_request_check(
    name: str,
    title: str,
    baseline: float,
    candidate: float,
    limit: PerRequestLimit,
    *,
    requests: int,
    unit_scale: float = 1,
) -> Check:
    """`limit.max_increase` and `limit.min_count_increase` (over the candidate's `requests`)
    are in the figure's own units, times `unit_scale` (tokens per block, for a count of blocks
    compared in tokens). The limit is the more lenient of the relative one and the floor."""
    relative = baseline * (1 + limit.max_relative_increase) + limit.max_increase * unit_scale
    floor = baseline + limit.min_count_increase * unit_scale / max(requests, 1)
    return _judge(
        name,
        title,
        "per_request",
        baseline=baseline,
        candidate=candidate,
        limit=max(relative, floor),
        bound="max",
        enabled=limit.enabled,
    )


def _regret_check(baseline: RunFigures, candidate: RunFigures, thresholds: Thresholds) -> Check:
    limit = thresholds.eviction_regret
    regret = float(baseline.regret["regret_ratio"])
    return _judge(
        "eviction_regret",
        "evicted blocks later stored again",
        "ratio",
        baseline=regret,
        candidate=float(candidate.regret["regret_ratio"]),
        limit=regret + limit.max_increase,
        bound="max",
        enabled=limit.enabled,
    )


def _pool_empty_check(baseline: RunFigures, candidate: RunFigures, thresholds: Thresholds) -> Check:
    """A pool with no free block left (the next request waits, or preempts another) fails
    the candidate, unless the baseline's ran empty too: then it is no regression."""
    limit = thresholds.min_free_blocks
    name, title = "pool_not_empty", "fewest free blocks (0: the pool ran empty)"
    if not candidate.free_blocks["usable_blocks"]:
        return Check(name, title, "count", SKIP, reason="the candidate recorded no pool state")
    return _judge(
        name,
        title,
        "count",
        baseline=baseline.min_free_blocks,
        candidate=candidate.min_free_blocks,
        limit=1 if baseline.min_free_blocks else 0,
        bound="min",
        enabled=limit.enabled and not limit.allow_empty,
    )


def _summary_count_check(
    name: Literal["collisions", "dropped_events"],
    title: str,
    baseline: RunFigures,
    candidate: RunFigures,
    *,
    most: float,
    enabled: bool = True,
) -> Check:
    """A count of the runs' summaries (`name`) that the candidate may have at most `most` of."""
    return _judge(
        name,
        title,
        "count",
        baseline=baseline.summary[name],
        candidate=candidate.summary[name],
        limit=most,
        bound="max",
        enabled=enabled,
    )


def _tenant_checks(
    baseline: RunFigures, candidate: RunFigures, thresholds: Thresholds
) -> list[Check]:
    """One check per tenant (and adapter) seen in both runs with enough requests in each."""
    limit = thresholds.tenant_hit_ratio
    title = "token hit ratio of"
    if not limit.enabled:
        return [Check("tenant_hit_ratio", f"{title} each tenant", "ratio", SKIP, reason=_DISABLED)]
    before = {tenant_label(row): row for row in baseline.tenants}
    after = {tenant_label(row): row for row in candidate.tenants}
    checks = []
    for label in sorted(before.keys() | after.keys()):
        name = f"tenant_hit_ratio[{label}]"
        old, new = before.get(label), after.get(label)
        if old is None or new is None:
            only = "baseline" if new is None else "candidate"
            reason = f"only in the {only} run"
            checks.append(Check(name, f"{title} {label}", "ratio", SKIP, reason=reason))
            continue
        old_ratio, new_ratio = old.hit_ratio, new.hit_ratio
        requests = min(old.requests, new.requests)
        if requests < limit.min_requests:
            reason = f"{requests} requests, fewer than min_requests = {limit.min_requests}"
            checks.append(
                Check(name, f"{title} {label}", "ratio", SKIP, old_ratio, new_ratio, reason=reason)
            )
            continue
        checks.append(
            _judge(
                name,
                f"{title} {label}",
                "ratio",
                baseline=old_ratio,
                candidate=new_ratio,
                limit=old_ratio - limit.max_drop,
                bound="min",
            )
        )
    return checks
