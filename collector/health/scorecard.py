"""The health scorecard of a run: one line each for its hit ratio against what its traffic
could reach, its biggest miss cause, pool pressure, evicted blocks needed again, collisions
and dropped records, its fleet's balance (several engines), and the advisor's top action
(the advice `kvscope advise` kept: advice.py). Each line is judged over the whole run
against thresholds.py's limits (docs/health.md)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from collector.health.advice import advisor_line
from collector.health.fleet import fleet_line
from collector.health.line import HealthLine, Status, rising, worst
from collector.health.thresholds import Thresholds, load_thresholds
from collector.model.mrc import miss_ratio_curve
from collector.model.nicknames import nickname
from collector.queries.collisions import collision_check
from collector.queries.evictions import regretted_families
from collector.queries.fleet import num_engines
from collector.queries.miss_causes import CAUSE_NAMES, cause_totals, detail_totals
from collector.queries.pool import free_block_extremes
from collector.queries.requests import engine_block_streams
from collector.queries.summary import RunSummary, run_summary
from collector.queries.timeline import time_grid
from collector.store.run_file import RunFile

SERVED = ("hit", "tier")


def scorecard(run: RunFile, thresholds: Thresholds | None = None) -> list[HealthLine]:
    """The run's lines, in the order the Overview shows them."""
    limits = load_thresholds() if thresholds is None else thresholds
    summary = run_summary(run)
    totals = cause_totals(run)
    return [
        hit_ratio_line(run, summary, limits["hit_ratio"]),
        miss_cause_line(run, totals, limits["miss_cause"]),
        pool_line(run, summary, limits["pool"]),
        eviction_line(run, totals, limits["evictions"]),
        integrity_line(run, summary, limits["integrity"]),
        fleet_line(run, totals, limits["fleet"]),
        advisor_line(run, summary, limits["advisor"]),
    ]


def hit_ceiling(run: RunFile) -> float:
    """The token hit ratio an unlimited cache would give the run's requests, each engine's on
    its own pool: the top of each engine's one-pass curve (collector/model/mrc.py)."""
    block_size, streams = engine_block_streams(run)
    curves = [miss_ratio_curve(stream, block_size) for stream in streams.values()]
    prompt_tokens = sum(curve.prompt_tokens for curve in curves)
    hit_tokens = sum(float(curve.hit_blocks[-1]) * block_size for curve in curves)
    return hit_tokens / prompt_tokens if prompt_tokens else 0.0


def hit_ratio_line(run: RunFile, summary: RunSummary, limits: dict[str, Any]) -> HealthLine:
    name, page = "Hit ratio against this traffic's ceiling", "policies"
    if not summary["prompt_tokens"]:
        return HealthLine(name, "grey", "This run has no lookups: no hit ratio to judge.", page)
    served = summary["token_hit_ratio"] + summary["tier_token_hit_ratio"]
    tier = " (the offload tier's loads included)" if summary["tier_hit_tokens"] else ""
    ceiling = hit_ceiling(run)
    fleet = " (each engine on its own pool)" if num_engines(run) > 1 else ""
    if ceiling < limits["min_ceiling"]:
        return HealthLine(
            name,
            "green",
            f"{served:.1%} of prompt tokens hit the cache{tier}, and an unlimited cache would "
            f"reach only {ceiling:.1%}{fleet}: no cache size serves these requests, as they were "
            "keyed, any better.",
            page,
        )
    reach = min(served / ceiling, 1.0)
    status: Status = (
        "green"
        if reach >= limits["green_at_least"]
        else "amber"
        if reach >= limits["amber_at_least"]
        else "red"
    )
    return HealthLine(
        name,
        status,
        f"{served:.1%} of prompt tokens hit the cache{tier}: {reach:.0%} of the {ceiling:.1%} "
        f"an unlimited cache would reach on this traffic{fleet} (the one-pass curve's top).",
        page,
    )


def miss_cause_line(run: RunFile, totals: pd.DataFrame, limits: dict[str, Any]) -> HealthLine:
    name, page = "Biggest miss cause", "requests"
    looked_up = int(totals["tokens"].sum())
    if not looked_up:
        return HealthLine(name, "grey", "This run has no lookups: no misses to explain.", page)
    lost = totals[~totals["cause"].isin(SERVED) & (totals["tokens"] > 0)]
    lost = lost.sort_values("tokens", ascending=False, kind="stable")
    if lost.empty:
        return HealthLine(name, "green", "No prompt token missed the cache.", page)
    share = dict(zip(lost["cause"], lost["share"], strict=True))
    avoidable = [cause for cause in share if cause not in (*limits["inherent"], "unexplained")]
    biggest = str(lost["cause"].iloc[0])
    words = _cause_words(run, biggest)
    if biggest in avoidable:
        sentence = f"The biggest loss is {words}: {share[biggest]:.1%} of the prompt tokens"
    else:
        kind = _NOT_AVOIDABLE.get(biggest, "inherent to the traffic")
        sentence = f"The biggest loss is {words}, {kind}, at {share[biggest]:.1%}"
        sentence += (
            f"; the biggest avoidable one is {_cause_words(run, avoidable[0])} at "
            f"{share[avoidable[0]]:.1%}"
            if avoidable
            else "; nothing avoidable was lost"
        )
    unexplained = share.get("unexplained", 0.0)
    if unexplained and biggest != "unexplained":
        sentence += f"; {unexplained:.1%} could not be told"
    status = worst(
        rising(
            share[avoidable[0]] if avoidable else 0.0, limits["amber_share"], limits["red_share"]
        ),
        "amber" if unexplained >= limits["amber_share"] else "green",
    )
    return HealthLine(name, status, sentence + ".", page)


# How the line words a biggest cause it does not judge, other than the traffic's own.
_NOT_AVOIDABLE = {
    "unexplained": "could not be told",
    "engine_stopped": "which no cache setting removes (a restart starts empty)",
}


def _cause_words(run: RunFile, cause: str) -> str:
    """A cause's name; a key mismatch's with the kind of key that lost it most tokens."""
    if cause != "key_mismatch":
        return CAUSE_NAMES[cause]
    details = detail_totals(run)
    keys = details[details["cause"] == cause].sort_values("tokens", ascending=False)
    kind = keys["key_kind"].iloc[0] if not keys.empty else None
    return CAUSE_NAMES[cause] + (f" ({kind})" if isinstance(kind, str) else "")


def pool_line(run: RunFile, summary: RunSummary, limits: dict[str, Any]) -> HealthLine:
    name, page = "Pool pressure", "free_blocks"
    fraction = limits["low_free_fraction"]
    pool = free_block_extremes(run, fraction)
    usable = pool["usable_blocks"]
    if not usable:
        return HealthLine(name, "grey", "No pool snapshots in this run: pressure unknown.", page)
    requests, preemptions = summary["requests"], summary["preemptions"]
    per_request = preemptions / requests if requests else 0.0
    status = worst(
        rising(pool["low_free_time_share"], limits["amber_time_share"], limits["red_time_share"]),
        rising(
            per_request,
            limits["amber_preemptions_per_request"],
            limits["red_preemptions_per_request"],
        ),
    )
    return HealthLine(
        name,
        status,
        f"The pool spent {pool['low_free_time_share']:.1%} of the time under {fraction:.0%} "
        f"free (fewest free: {pool['min_free_blocks']:,} of {usable:,} blocks), with "
        f"{preemptions:,} preemption{'s' * (preemptions != 1)} in {requests:,} requests.",
        page,
    )


def eviction_line(run: RunFile, totals: pd.DataFrame, limits: dict[str, Any]) -> HealthLine:
    """Judged by the prompt tokens lost to evictions (`totals`: the run's `cause_totals`)."""
    name, page = "Hot prefixes evicted and stored again", "free_blocks"
    lost = float(totals.loc[totals["cause"] == "evicted", "share"].sum())
    families = regretted_families(run, time_grid(run).whole_run(), limit=1_000_000)
    needed = int(families["needed_again"].sum())
    if not needed:
        return HealthLine(
            name,
            rising(lost, limits["amber_share"], limits["red_share"]),
            f"No evicted block was needed again; evictions cost {lost:.1%} of the prompt tokens.",
            page,
        )
    owner = families["owner"].iloc[0]
    top = f"{nickname(owner)}'s prompts" if isinstance(owner, str) else "prompts of no tenant"
    count, most = len(families), int(families["needed_again"].iloc[0])
    return HealthLine(
        name,
        rising(lost, limits["amber_share"], limits["red_share"]),
        f"{needed:,} evicted blocks were needed again and stored afresh, in {count:,} prefix "
        f"famil{'ies' if count != 1 else 'y'} (the most, {most:,}, of {top}); evictions cost "
        f"{lost:.1%} of the prompt tokens.",
        page,
    )


def integrity_line(run: RunFile, summary: RunSummary, limits: dict[str, Any]) -> HealthLine:
    name, page = "Collisions and dropped records", "collisions"
    check = collision_check(run, time_grid(run).whole_run())
    collisions, dropped, kept = summary["collisions"], summary["dropped_events"], summary["events"]
    checked = (
        f"{collisions:,} hash collision{'s' * (collisions != 1)} in "
        f"{check['hits_checked']:,} block hits checked"
        if check["checked"]
        else f"collisions not checked (the check was off; {check['hash_algo']} hashes)"
    )
    dropped_share = dropped / kept if kept else float(dropped > 0)
    status = worst(
        "red" if collisions >= limits["red_collisions"] else "green",
        "red" if dropped and dropped_share >= limits["red_dropped_share"] else "green",
        "amber" if dropped else "green",
    )
    return HealthLine(
        name,
        status,
        f"{checked[0].upper()}{checked[1:]}; {dropped:,} records dropped by the capture, "
        f"against {kept:,} kept.",
        page,
    )
