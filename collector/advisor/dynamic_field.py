"""A dynamic field (timestamp, id) near the start of otherwise identical prompts.

Such requests agree up to a token offset, differ for a short span (the field: a different
value in nearly every request), then agree again for a long stretch at the same offsets.
Everything after the field is recomputed for every request, because a block hash chains
over all tokens before it. Finding them needs the prompts' token ids.

Detection: windows of WINDOW tokens at each offset near the start are grouped by content;
a group of requests that shares a window at offset p but not everything before p is a
candidate; the field is the span before p where the group disagrees.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from collector.advisor.context import RunContext
from collector.advisor.miss_breakdown import quote_causes
from collector.advisor.suggestion import Chart, Series, Suggestion, severity_for_gain
from collector.model.trace_request import TraceRequest
from collector.queries.miss_causes import cause_totals, requests_cause_tokens
from collector.queries.requests import has_token_ids, mean_hit_tokens, requests_from_run
from collector.safe_text import code
from collector.store.run_file import RunFile

WINDOW = 16
SCAN_TOKENS = 512  # "near the start": fields that begin within this many tokens
SCAN_REQUESTS = 5_000  # families are looked for among the first requests only (memory)
MIN_FAMILY = 5
MAX_FIELD_TOKENS = 64
MIN_AGREEMENT = 32


@dataclass(frozen=True)
class DynamicField:
    """A family of requests and the span [start, end) where each has its own value."""

    members: tuple[int, ...]  # indices into the prompts
    start: int
    end: int
    agreement: int  # identical tokens right after the field
    distinct_values: int


def find_dynamic_fields(prompts: Sequence[tuple[int, ...]]) -> list[DynamicField]:
    """Every family of at least MIN_FAMILY prompts with a short field before a long
    identical stretch, largest families first."""
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for index, tokens in enumerate(prompts[:SCAN_REQUESTS]):
        for position in range(1, min(len(tokens) - WINDOW, SCAN_TOKENS) + 1):
            groups[(position, hash(tokens[position : position + WINDOW]))].append(index)
    candidates = sorted(
        (
            (position, members)
            for (position, _), members in groups.items()
            if len(members) >= MIN_FAMILY
        ),
        key=lambda item: (-len(item[1]), item[0]),
    )
    fields: list[DynamicField] = []
    seen: set[frozenset[int]] = set()
    assigned: set[int] = set()
    for position, members in candidates:
        member_set = frozenset(members)
        if member_set in seen or len(member_set & assigned) * 2 > len(member_set):
            continue
        # A family shares its header before the field too: only a window with a field
        # before it settles the family, so later windows of the same members are still read.
        found = _field_before(prompts, members, position)
        if found is not None:
            seen.add(member_set)
            fields.append(found)
            assigned |= member_set
    return fields


def _field_before(
    prompts: Sequence[tuple[int, ...]], members: list[int], position: int
) -> DynamicField | None:
    reference = prompts[members[0]]
    others = [prompts[member] for member in members[1:]]
    start = position  # where the first member that differs from the reference does
    for other in others:
        start = _common_prefix(reference, other, start)
    if start >= position:
        return None  # a plain shared prefix: nothing differs before the window
    end = position
    while end > start and all(other[end - 1] == reference[end - 1] for other in others):
        end -= 1
    if end - start > MAX_FIELD_TOKENS:
        return None
    limit = min(len(other) for other in (reference, *others))
    agreed_to = position + WINDOW
    while agreed_to < limit and all(other[agreed_to] == reference[agreed_to] for other in others):
        agreed_to += 1
    distinct = len({prompts[member][start:end] for member in members})
    if agreed_to - end < MIN_AGREEMENT or distinct * 2 < len(members):
        return None
    return DynamicField(tuple(members), start, end, agreed_to - end, distinct)


def _common_prefix(first: tuple[int, ...], second: tuple[int, ...], limit: int) -> int:
    """How many tokens the two share from the first, `limit` at most."""
    end = min(limit, len(first), len(second))
    if first[:end] == second[:end]:  # most do: compared whole, at C speed
        return end
    return next(offset for offset in range(end) if first[offset] != second[offset])


def family_label(request_ids: Sequence[str]) -> str:
    """A name for a family: the request ids' common prefix (`report-*`), if they have one."""
    first, last = min(request_ids), max(request_ids)  # their common prefix is everyone's
    length = next(
        (
            offset
            for offset, (one, other) in enumerate(zip(first, last, strict=False))
            if one != other
        ),
        min(len(first), len(last)),
    )
    prefix = re.sub(r"\d+$", "", first[:length])
    return f"{prefix}*" if prefix else f"{len(request_ids)} requests"


def field_moved_after(request: TraceRequest, found: DynamicField) -> TraceRequest:
    """The request with its field moved after the identical stretch that follows it."""
    assert request.token_ids is not None
    tokens = request.token_ids
    shared_end = found.end + found.agreement
    moved = tokens[: found.start] + tokens[found.end : shared_end] + tokens[found.start : found.end]
    return replace(request, token_ids=moved + tokens[shared_end:])


@dataclass(frozen=True)
class FieldCost:
    """What a family's dynamic field costs: the prefix-hit tokens the run would gain with
    the field moved after the stretch it precedes (one-pass curve at the run's pool), the
    prompt tokens each member hits now on average, the tokens each could reuse without the
    field in front, and the block-aligned tokens more that makes per request."""

    label: str
    members: int
    gain_tokens: float
    hits_now: float
    reusable: int
    per_request: int
    diverged: int  # the members' prompt tokens the miss breakdown counts as diverged


def field_cost(context: RunContext, requests: list[TraceRequest], found: DynamicField) -> FieldCost:
    members = [requests[index] for index in found.members]
    block_size, num_blocks = context.block_size, context.num_blocks
    moved = list(requests)
    for index in found.members:
        moved[index] = field_moved_after(requests[index], found)
    now = context.tokens_at(context.token_curve(block_size), num_blocks)
    after = context.tokens_at(context.prompts_curve(moved, block_size), num_blocks)
    shared = found.start + found.agreement
    member_ids = [request.request_id for request in members]
    return FieldCost(
        label=family_label(member_ids),
        members=len(members),
        gain_tokens=max(after - now, 0.0),
        hits_now=mean_hit_tokens(context.run, member_ids),
        reusable=shared // block_size * block_size,
        per_request=shared // block_size * block_size - found.start // block_size * block_size,
        diverged=requests_cause_tokens(context.run, "diverged", member_ids),
    )


@dataclass(frozen=True)
class DivergingField:
    """A dynamic field behind diverged tokens, for the miss breakdown's `diverged` line: the
    family (`label`, its `requests`), the field's tokens [`start`, `end`) of their prompts,
    and the prompt tokens its requests' lookups lost to `diverged` (`diverged_tokens`)."""

    label: str
    requests: int
    start: int
    end: int
    diverged_tokens: int


def diverging_fields(run: RunFile, path: Path) -> list[DivergingField]:
    """The dynamic fields the dynamic-field rule names, those whose requests lost tokens to
    `diverged`, most first: the rule's detection over the recorded prompts, without its
    one-pass curves. Nothing (and no prompt read) when the run lost no token to `diverged`
    or recorded no token ids. `path` names the run in errors."""
    totals = cause_totals(run)
    if not int(totals.loc[totals["cause"] == "diverged", "tokens"].sum()) or not has_token_ids(run):
        return []
    requests = requests_from_run(run, path)
    found = []
    for field in find_dynamic_fields([request.token_ids or () for request in requests]):
        member_ids = [requests[index].request_id for index in field.members]
        diverged = requests_cause_tokens(run, "diverged", member_ids)
        if diverged:
            found.append(
                DivergingField(
                    family_label(member_ids), len(member_ids), field.start, field.end, diverged
                )
            )
    return sorted(found, key=lambda field: -field.diverged_tokens)


def dynamic_field(context: RunContext) -> list[Suggestion]:
    """One suggestion per family with a dynamic field."""
    requests = context.requests
    prompts = [request.token_ids or () for request in requests]
    return [
        _suggestion(context, requests, found, field_cost(context, requests, found))
        for found in find_dynamic_fields(prompts)
    ]


def _suggestion(
    context: RunContext, requests: list[TraceRequest], found: DynamicField, cost: FieldCost
) -> Suggestion:
    width, label, gain_tokens = found.end - found.start, cost.label, cost.gain_tokens
    quote = quote_causes(context.miss_breakdown, "diverged")
    family_part = (
        f"; {cost.diverged:,} of them are the {code(label)} requests'" if quote.lines else ""
    )
    return Suggestion(
        rule="dynamic-field",
        title=f"{code(label)} prompts carry a dynamic field at token {found.start}",
        severity=severity_for_gain(context.share(gain_tokens)),
        evidence=[
            f"{cost.members} requests ({code(label)}) agree on tokens 0-{found.start - 1}, "
            f"then differ for {width} tokens ({found.start}-{found.end - 1}: "
            f"{found.distinct_values} distinct values, a timestamp or an id), then agree again for "
            f"{found.agreement} tokens ({found.end}-{found.end + found.agreement - 1})",
            f"they hit {cost.hits_now:.0f} prompt tokens each on average; without the field "
            f"in front, each could reuse {cost.reusable} "
            f"(about {cost.per_request} tokens more per request, recomputed now)",
            *(line + family_part for line in quote.lines),
        ],
        effect=(
            f"about {gain_tokens:,.0f} more prompt tokens served from the cache over this run "
            f"(+{context.share(gain_tokens) * 100:.1f} points of token hit ratio; one-pass "
            "curve of the prompts with the field moved, at the run's pool size)"
        ),
        action=(
            f"prompt change: move the {width}-token field at token {found.start} of the "
            f"{code(label)} prompts after the {found.agreement} shared tokens that follow it "
            "(or drop it)"
        ),
        gain_tokens=gain_tokens,
        figures={
            "family": label,
            "requests": cost.members,
            "field_start": found.start,
            "field_tokens": width,
            "agreement_tokens": found.agreement,
            "tokens_per_request": cost.per_request,
            **quote.figures,
            **({"family_cause_tokens": cost.diverged} if quote.lines else {}),
        },
        charts=[_agreement_chart(requests, found, label)],
    )


def _agreement_chart(requests: list[TraceRequest], found: DynamicField, label: str) -> Chart:
    """Per token offset: the share of the family holding the most common token there."""
    prompts = [requests[index].token_ids or () for index in found.members]
    last = min(found.end + found.agreement + WINDOW, *(len(tokens) for tokens in prompts))
    shares = [
        Counter(tokens[offset] for tokens in prompts).most_common(1)[0][1] / len(prompts)
        for offset in range(last)
    ]
    return Chart(
        kind="line",
        title=f"{label}: share of requests agreeing, by token offset",
        x_title="token offset",
        y_title="requests holding the most common token",
        series=[Series(label, list(range(last)), shares)],
        markers={"field starts": found.start, "field ends": found.end},
    )
