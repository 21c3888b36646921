"""What `kvscope explain` says of a run, as JSON-ready documents with stable keys: the run's
miss breakdown (every cause, the unexplained tokens by reason, the prefix families that lost
most) and one request's lookups, with the cause of each missed block and its prompt text.
explain.py prints them as text or JSON; collector/queries/miss_causes.py defines the causes.
Tenants and adapters are the labels the run stored (the text output gives pseudonyms their
nicknames)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any, cast

import pandas as pd

from collector.advisor.dynamic_field import diverging_fields
from collector.model.family_names import family_names, name_of
from collector.queries.config import run_config
from collector.queries.miss_causes import (
    CAUSE_NAMES,
    UNEXPLAINED_REASONS,
    cause_totals,
    family_losses,
    lookup_causes,
    request_block_causes,
)
from collector.queries.request_search import family_roots, request_tenants
from collector.queries.timeline import time_grid
from collector.store.run_file import RunFile
from collector.token_text import TextTokenizer

TOP_FAMILIES = 5
NOT_MISSES = ("hit", "tier")  # served tokens: a family's losses leave them out
_DETAILS = ("key_kind", "other_engine", "evicted_on", "evicted_by")


def run_breakdown(run: RunFile, tokenizer: Callable[[], TextTokenizer | None]) -> dict[str, Any]:
    """The run's prompt tokens per cause, the unexplained ones by reason, the dynamic fields
    behind its diverged tokens (the advisor's dynamic-field rule: the field's family, its
    token span and the tokens its requests lost to `diverged`), and the prefix families that
    missed most tokens, each with the causes it lost them to and the text of its first block
    (`tokenizer()` loads the tokenizer, asked only when the run recorded token ids)."""
    totals = cause_totals(run)
    rows = lookup_causes(run)
    prompt_tokens = int(totals["tokens"].sum())
    return {
        "run": str(run.path),
        "prompt_tokens": prompt_tokens,
        "lookups": int(rows[["engine", "rank", "seq"]].drop_duplicates().shape[0]),
        "causes": [
            {
                "cause": str(row["cause"]),
                "name": CAUSE_NAMES[str(row["cause"])],
                "tokens": int(row["tokens"]),
                "share": float(row["share"]),
                "lookups": int(row["lookups"]),
            }
            for row in records(totals)
        ],
        "unexplained": _unexplained(rows[rows["cause"] == "unexplained"]),
        "dynamic_fields": [asdict(field) for field in diverging_fields(run, run.path)],
        "families": _families(run, prompt_tokens, tokenizer),
    }


def _unexplained(rows: pd.DataFrame) -> list[dict[str, Any]]:
    """The unexplained tokens per reason (a lookup's row gives the reason of its first
    unexplained block), most first."""
    reasons = (
        rows.groupby("reason", dropna=False)
        .agg(tokens=("tokens", "sum"), lookups=("seq", "size"))
        .sort_values("tokens", ascending=False)
        .reset_index()
    )
    return [
        {
            "reason": str(row["reason"]) if _present(row["reason"]) else None,
            "why": UNEXPLAINED_REASONS.get(str(row["reason"]), "no reason recorded"),
            "tokens": int(row["tokens"]),
            "lookups": int(row["lookups"]),
        }
        for row in records(reasons)
    ]


def _families(
    run: RunFile, prompt_tokens: int, tokenizer: Callable[[], TextTokenizer | None]
) -> list[dict[str, Any]]:
    """The TOP_FAMILIES families that missed most tokens (a request with no block has none:
    left out), named by their first block and its first storer's tenant, with the text of
    that block where the run recorded its tokens and the tokenizer is here; named as every
    page names them (collector/model/family_names.py)."""
    losses = family_losses(run)
    losses = losses[losses["family"].notna()]
    top = list(dict.fromkeys(int(family) for family in losses["family"]))[:TOP_FAMILIES]
    roots = family_roots(run, top)
    decoder = tokenizer() if roots["token_ids"].notna().any() else None
    names = family_names(roots, decoder.decode if decoder is not None else None)
    firsts = {int(row["family"]): row for row in records(roots)}
    families = []
    for family in top:
        rows = losses[losses["family"] == family]
        first = firsts.get(family, {"tenant": None, "lora": None, "token_ids": None})
        families.append(
            {
                "family": f"{family:016x}",
                "owner": first["tenant"],
                "adapter": first["lora"],
                "name": name_of(names, family),
                "text": None
                if decoder is None or first["token_ids"] is None
                else decoder.decode(list(first["token_ids"])),
                "missed_tokens": int(rows["family_tokens"].iloc[0]),
                "share_of_prompt_tokens": int(rows["family_tokens"].iloc[0]) / prompt_tokens,
                "requests": int(rows["requests"].max()),
                "causes": [
                    {"cause": cause, "name": CAUSE_NAMES[cause], "tokens": int(tokens)}
                    for cause, tokens in zip(rows["cause"], rows["tokens"], strict=True)
                ],
            }
        )
    return families


def request_explanation(
    run: RunFile,
    request: dict[str, Any],
    prompt_text: Any,
    tokenizer: Callable[[], TextTokenizer | None],
) -> dict[str, Any]:
    """One request (`request`: its `requests` row) and its lookups: per cause its tokens and
    the details of its first block, and per missed full block its state, cause, details and
    text (`prompt_text(first, end)`: the prompt's tokens `first..end` as text, or None)."""
    request_id = str(request["request_id"])
    causes = lookup_causes(run, request_id)
    blocks = request_block_causes(run, request_id)
    roots = family_roots(run, [int(family) for family in causes["evicted_by_family"].dropna()])
    decoder = tokenizer() if roots["token_ids"].notna().any() else None
    families = family_names(roots, decoder.decode if decoder is not None else None)
    evictors = request_tenants(
        run, [*causes["evicted_by"].dropna(), *blocks["evicted_by"].dropna()]
    )
    start_ns = time_grid(run).start_ns
    block_size = int(run_config(run)["block_size"])
    lookups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in records(causes):
        lookups.setdefault((row["seq"], row["engine"], row["rank"]), []).append(row)
    block_rows = records(blocks)
    document_lookups = []
    for (seq, engine, rank), rows in lookups.items():
        own = [
            row
            for row in block_rows
            if (row["seq"], row["engine"], row["rank"]) == (seq, engine, rank)
        ]
        document_lookups.append(
            {
                "seq": int(seq),
                "engine": str(engine),
                "rank": int(rank),
                "at_s": (int(rows[0]["ts_ns"]) - start_ns) / 1e9,
                "resumes_preemption": bool(rows[0]["preempted"]),
                "prompt_tokens": sum(int(row["tokens"]) for row in rows),
                "causes": [_cause_row(row, evictors, families) for row in rows],
                "blocks": [_block_row(row, evictors, prompt_text, block_size) for row in own],
            }
        )
    return {
        "run": str(run.path),
        "request": request_id,
        "tenant": request["tenant"],
        "lora": request["lora"],
        "prompt_tokens": int(request["num_prompt_tokens"]),
        "preemptions": int(request["num_preemptions"] or 0),
        "block_size": block_size,
        "lookups": document_lookups,
    }


def _cause_row(
    row: dict[str, Any],
    evictors: dict[str, str | None],
    families: dict[int, str],
) -> dict[str, Any]:
    """A lookup's cause: its tokens, blocks, first block and that block's details, with the
    prefix family of the request whose allocation evicted it, where one did."""
    cause = str(row["cause"])
    details = _details(row, evictors)
    if _present(row.get("evicted_by_family")):
        family = int(row["evicted_by_family"])
        details["evicted_by_family"] = f"{family:016x}"
        details["evicted_by_family_name"] = name_of(families, family)
    return {
        "cause": cause,
        "name": CAUSE_NAMES[cause],
        "tokens": int(row["tokens"]),
        "blocks": int(row["blocks"]),
        "first_position": int(row["first_position"]),
        "details": details,
    }


def _block_row(
    row: dict[str, Any], evictors: dict[str, str | None], prompt_text: Any, block_size: int
) -> dict[str, Any]:
    position = int(row["position"])
    cause = str(row["cause"])
    return {
        "position": position,
        "state": str(row["state"]),
        "cause": cause,
        "name": CAUSE_NAMES[cause],
        "details": _details(row, evictors),
        "text": prompt_text(position * block_size, (position + 1) * block_size),
    }


def _details(row: dict[str, Any], evictors: dict[str, str | None]) -> dict[str, Any]:
    """The details a cause's row or a block's row gives, only those it has: `reason` and its
    `why` (unexplained), `key_kind`, `other_engine`, `evicted_on`, `evicted_by` with its
    `evicted_by_tenant` and `evicted_ago_s`."""
    details: dict[str, Any] = {name: str(row[name]) for name in _DETAILS if _present(row.get(name))}
    if _present(row.get("reason")):
        details["reason"] = str(row["reason"])
        details["why"] = UNEXPLAINED_REASONS.get(str(row["reason"]), "no reason recorded")
    if "evicted_by" in details:
        details["evicted_by_tenant"] = evictors.get(details["evicted_by"])
    if _present(row.get("evicted_ago_ns")):
        details["evicted_ago_s"] = int(row["evicted_ago_ns"]) / 1e9
    return details


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """A frame's rows as dicts by column name."""
    return cast("list[dict[str, Any]]", frame.to_dict("records"))


def _present(value: Any) -> bool:
    return not pd.isna(value)
