"""Tenant isolation and reuse: cache salts per request or per tenant, tenants sharing blocks.

vLLM mixes a request's `cache_salt` into its first block's hash, so every block after it
hashes differently: requests with different salts never share a block. A salt per tenant
isolates tenants (correct); a salt per request kills all reuse; tenants without salts (or
sharing one) share blocks, and a tenant can then learn from its time to first token
whether another tenant sent a prompt (a cross-tenant side channel).
"""

from __future__ import annotations

import pandas as pd

from collector.advisor.context import RunContext
from collector.advisor.miss_breakdown import quote_causes
from collector.advisor.suggestion import Chart, NotApplicable, Series, Suggestion
from collector.model.trace_request import TraceRequest
from collector.queries.tenants import cross_tenant_readers, salt_usage
from collector.safe_text import code, shown

MIN_SALTED_REQUESTS = 5
SINGLE_USE_SHARE = 0.5


def per_request_salts(context: RunContext) -> list[Suggestion]:
    """Fire when most salted requests carry a salt no other request uses."""
    usage = salt_usage(context.run)
    salted = usage[usage["salt_hash"].notna()]
    num_salted = int(salted["requests"].sum())
    if num_salted < MIN_SALTED_REQUESTS:
        return []
    single_use = int((salted["requests"] == 1).sum())
    if single_use < SINGLE_USE_SHARE * num_salted:
        return []
    salted_ratio = salted["hit_tokens"].sum() / max(salted["prompt_tokens"].sum(), 1)
    evidence = [
        f"{num_salted:,} requests carry {len(salted):,} distinct cache salts; "
        f"{single_use:,} salts are used by one request only",
        f"salted requests hit {salted_ratio:.1%} of their prompt tokens",
    ]
    effect, gain_tokens = _per_tenant_effect(context, evidence)
    quote = quote_causes(context.miss_breakdown, "key_mismatch", key_kind="cache_salt")
    evidence += quote.lines
    return [
        Suggestion(
            rule="per-request-salt",
            title="A cache salt per request: no request can reuse another's prefix",
            severity="high" if context.share(gain_tokens) >= 0.05 else "medium",
            evidence=evidence,
            effect=effect,
            action=(
                "set the request field `cache_salt` once per tenant (the same secret value "
                "for all of a tenant's requests), not per request"
            ),
            gain_tokens=gain_tokens,
            figures={
                "salted_requests": num_salted,
                "salts": len(salted),
                "single_use": single_use,
                **quote.figures,
            },
        )
    ]


def _per_tenant_namespace(request: TraceRequest) -> tuple[str | None, str | None]:
    salt = None if request.cache_salt is None else f"tenant:{request.tenant}"
    return (request.lora, salt)


def _per_tenant_effect(context: RunContext, evidence: list[str]) -> tuple[str, float]:
    """The hits one salt per tenant would give (one-pass curve), if the prompts were recorded."""
    try:
        now = context.token_curve(context.block_size)
    except NotApplicable as error:
        return f"reuse within each tenant again; not quantified: {error}", 0.0
    per_tenant = context.token_curve(context.block_size, _per_tenant_namespace, "per-tenant-salt")
    groups: dict[tuple[int, ...], set[str | None]] = {}
    for request in context.requests:
        if request.cache_salt is not None and request.token_ids is not None:
            groups.setdefault(request.token_ids[: context.block_size], set()).add(
                request.cache_salt
            )
    if groups:
        widest = max(len(salts) for salts in groups.values())
        evidence.append(f"the same first block of tokens is stored under up to {widest} salts")
    gain = context.tokens_at(per_tenant, context.num_blocks) - context.tokens_at(
        now, context.num_blocks
    )
    return (
        f"about {gain:,.0f} more prompt tokens from the cache over this run "
        f"(+{context.share(gain) * 100:.1f} points of token hit ratio; one-pass curve with one "
        "salt per tenant), tenants still isolated",
        max(gain, 0.0),
    )


def shared_across_tenants(context: RunContext) -> list[Suggestion]:
    """Fire when one tenant's requests hit blocks another tenant stored."""
    shared = cross_tenant_readers(context.run)
    if shared.empty:
        return []
    return [_shared_blocks(context, shared)]


def _shared_blocks(context: RunContext, shared: pd.DataFrame) -> Suggestion:
    blocks = int(shared["blocks"].sum())
    lost_tokens = blocks * context.block_size
    return Suggestion(
        rule="cross-tenant-sharing",
        title="Tenants share cached blocks: a cross-tenant side channel",
        severity="high",
        evidence=_sharing_evidence(shared, blocks),
        effect=(
            "tenants are isolated; the cross-tenant hits are lost: about "
            f"{lost_tokens:,} prompt tokens over this run "
            f"({context.share(lost_tokens) * 100:.1f} points of token hit ratio)"
        ),
        action=(
            "give every tenant its own secret `cache_salt` (request field), used for all "
            "of its requests"
        ),
        figures={
            "cross_tenant_block_hits": blocks,
            "lost_tokens": lost_tokens,
            "pairs": shared.to_dict("records"),
        },
        charts=[_sharing_chart(shared)],
    )


def _sharing_evidence(shared: pd.DataFrame, blocks: int) -> list[str]:
    unsalted = shared[shared["salt_hash"].isna()]
    pairs = [
        f"{code(row.reader)} hit {row.blocks:,} blocks stored by {code(row.writer)} "
        f"({row.requests:,} requests, {'no salt' if row.salt_hash is None else 'a shared salt'})"
        for row in shared.head(5).itertuples()
    ]
    return [
        f"{blocks:,} block hits crossed tenants "
        f"({int(unsalted['blocks'].sum()):,} of them without any cache salt)",
        *pairs,
        "a tenant that gets a fast first token knows another tenant sent that prefix",
    ]


def _sharing_chart(shared: pd.DataFrame) -> Chart:
    return Chart(
        kind="bar",
        title="Block hits on another tenant's blocks",
        x_title="reader <- writer",
        y_title="block hits",
        series=[
            Series(
                "block hits",
                [f"{shown(row.reader)} <- {shown(row.writer)}" for row in shared.itertuples()],
                shared["blocks"].astype(float).tolist(),
            )
        ],
    )
