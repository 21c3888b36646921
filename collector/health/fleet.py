"""The scorecard's fleet line: on a run of several engines (engine id x DP rank), whether
the router spread the requests evenly, whether any engine's hit ratio lags the others', and
how many prompt tokens missed because another engine held them (a routing miss)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from collector.health.line import HealthLine, Status, rising, worst
from collector.queries.fleet import engine_labels, engine_lineages, fleet_engines, lineage_ids
from collector.store.run_file import RunFile

NAME, PAGE = "Fleet balance and routing", "fleet"


def fleet_line(run: RunFile, totals: pd.DataFrame, limits: dict[str, Any]) -> HealthLine:
    """`totals`: the run's `cause_totals` (its `other_engine` share is the routing miss).
    The starts of one engine (restarted under its KVSCOPE_ENGINE_ID: `ID`, `ID #2`) are one
    engine here: they never served side by side, so they are not weighed against each other."""
    starts = fleet_engines(run)
    engines = _by_lineage(starts, engine_lineages(run))
    if len(engines) < 2:
        restarted = (
            f" (started {len(starts)} times: {', '.join(starts['engine'])})"
            if len(starts) > 1
            else ""
        )
        return HealthLine(
            NAME, "grey", f"One engine{restarted}: no fleet to balance or route.", PAGE
        )
    load, load_status = _load(engines, limits)
    hits, hits_status = _hits(engines, limits)
    routed = float(totals.loc[totals["cause"] == "other_engine", "share"].sum())
    routing_status = rising(
        routed, limits["amber_other_engine_share"], limits["red_other_engine_share"]
    )
    return HealthLine(
        NAME,
        worst(load_status, hits_status, routing_status),
        f"Of {len(engines)} engines, {load}; {hits}; {routed:.1%} of the prompt tokens missed "
        "because another engine had them cached.",
        PAGE,
    )


def _by_lineage(starts: pd.DataFrame, lineages: dict[tuple[str, int], str]) -> pd.DataFrame:
    """`fleet_engines`' rows, the starts of one engine (`engine_lineages`) added together."""
    keys = lineage_ids(starts["engine_id"], starts["dp_rank"], lineages)
    folded = (
        starts.assign(engine_id=keys)
        .groupby(["engine_id", "dp_rank"], as_index=False, sort=True)[
            ["requests", "prompt_tokens", "hit_tokens"]
        ]
        .sum()
    )
    return folded.assign(engine=engine_labels(folded["engine_id"], folded["dp_rank"]))


def _load(engines: pd.DataFrame, limits: dict[str, Any]) -> tuple[str, Status]:
    """The engine whose requests are farthest from the other engines' mean."""
    requests = engines["requests"].astype(float)
    others = (requests.sum() - requests) / (len(requests) - 1)
    ratio = (requests / others.where(others > 0)).fillna(1.0)
    balance = ratio.where(ratio <= 1, 1 / ratio)  # 0.5: half the others' mean, or double
    index = int(balance.to_numpy().argmin())
    status: Status = (
        "red"
        if balance.iloc[index] <= limits["red_request_ratio"]
        else "amber"
        if balance.iloc[index] <= limits["amber_request_ratio"]
        else "green"
    )
    if status == "green":  # the verdict first; no engine singled out
        return (
            f"the requests spread evenly (the farthest engine from the others' mean at "
            f"{ratio.iloc[index]:.2f}x)",
            status,
        )
    return (
        f"{engines['engine'].iloc[index]} got {int(requests.iloc[index]):,} requests against "
        f"the others' mean of {others.iloc[index]:,.0f} ({ratio.iloc[index]:.2f}x)",
        status,
    )


def _hits(engines: pd.DataFrame, limits: dict[str, Any]) -> tuple[str, Status]:
    """The engine whose token hit ratio is farthest below the other engines' together."""
    prompt = engines["prompt_tokens"].astype(float)
    hit = engines["hit_tokens"].astype(float)
    others = ((hit.sum() - hit) / (prompt.sum() - prompt).where(lambda s: s > 0)).fillna(0.0)
    own = (hit / prompt.where(prompt > 0)).fillna(0.0)
    gap = others - own
    index = int(gap.to_numpy().argmax())
    status = rising(float(gap.iloc[index]), limits["amber_hit_gap"], limits["red_hit_gap"])
    if status == "green":
        return (
            f"no engine's hit ratio lags the others' by more than "
            f"{max(float(gap.iloc[index]), 0.0) * 100:.1f} points",
            status,
        )
    words = (
        f"{engines['engine'].iloc[index]} hit {own.iloc[index]:.1%} of its prompt tokens "
        f"against {others.iloc[index]:.1%} on the others"
    )
    return words, status
