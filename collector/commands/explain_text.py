"""`kvscope explain` as text an operator reads: the verdict first, then the table of causes
(the hit first), the unexplained tokens with why, the prefix families that lost most; for one
request, each lookup's causes and its missed blocks, runs of alike blocks in one line with the
prompt text where they start. Every label from the run is shown escaped (safe_text.py), and
pseudonyms by their nicknames."""

from __future__ import annotations

from typing import Any

from collector.model.nicknames import nickname
from collector.safe_text import shown

MISSES = ("hit", "tier")  # not misses: the verdict names the largest cause besides these
TEXT_WIDTH = 100  # a block's prompt text, at most, on one line
KEY_KINDS = {
    "cache_salt": "cache salt",
    "lora": "LoRA adapter",
    "extra_keys": "extra key (a multimodal input, say)",
}


def breakdown_lines(document: dict[str, Any]) -> list[str]:
    """The run's breakdown: the verdict, the causes that took tokens, the unexplained ones
    by reason, the families that missed most."""
    prompt_tokens = document["prompt_tokens"]
    lookups = document["lookups"]
    head = (
        f"kvscope explain {shown(document['run'])}: {prompt_tokens:,} prompt tokens in "
        f"{_count(lookups, 'lookup')}"
    )
    if not prompt_tokens:
        return [
            head,
            "no lookups: a run of vLLM's KV events alone has no requests, so no miss causes",
        ]
    causes = [cause for cause in document["causes"] if cause["tokens"] or cause["cause"] == "hit"]
    lines = [head, _verdict(document["causes"]), ""]
    width = max(len(cause["name"]) for cause in causes)
    lines.append(f"{'cause':<{width}}  {'tokens':>11}  {'share':>7}  {'lookups':>7}")
    for cause in causes:
        lines.append(
            f"{cause['name']:<{width}}  {cause['tokens']:>11,}  {_percent(cause['share']):>7}  "
            f"{cause['lookups']:>7,}"
        )
    lines.append(
        f"{'all prompt tokens':<{width}}  {prompt_tokens:>11,}  {_percent(1.0):>7}  {lookups:>7,}"
    )
    lines += [
        "",
        *_field_lines(document["dynamic_fields"]),
        *_unexplained_lines(document["unexplained"]),
        "",
        *_family_lines(document["families"]),
    ]
    return lines


def _field_lines(fields: list[dict[str, Any]]) -> list[str]:
    """The dynamic fields behind diverged tokens, as the advisor's dynamic-field rule names
    them (none: no lines)."""
    if not fields:
        return []
    lines = [
        "diverged at a dynamic field (`kvscope advise`, rule dynamic-field, says what to move):"
    ]
    for field in fields:
        lines.append(
            f"  {field['diverged_tokens']:,} tokens of the {shown(field['label'])} requests "
            f"({field['requests']:,}): their prompts differ at tokens {field['start']:,}-"
            f"{field['end']:,}"
        )
    return [*lines, ""]


def _verdict(causes: list[dict[str, Any]]) -> str:
    shares = {cause["cause"]: cause for cause in causes}
    misses = [cause for cause in causes if cause["cause"] not in MISSES and cause["tokens"]]
    hit = f"{_percent(shares['hit']['share'])} of the prompt tokens hit"
    if not misses:
        return f"{hit}; none missed but the tail vLLM never caches"
    largest = max(misses, key=lambda cause: cause["tokens"])
    return (
        f"{hit}; the largest miss cause: {largest['name']}, {_percent(largest['share'])} "
        f"({largest['tokens']:,} tokens)"
    )


def _unexplained_lines(reasons: list[dict[str, Any]]) -> list[str]:
    if not reasons:
        return ["unexplained: none, every missed token has its cause"]
    lines = ["unexplained, by the reason of each lookup's first unexplained block:"]
    for reason in reasons:
        lines.append(
            f"  {reason['tokens']:,} tokens in {reason['lookups']:,} lookups: {reason['why']}"
        )
    return lines


def _family_lines(families: list[dict[str, Any]]) -> list[str]:
    if not families:
        return ["prefix families: none missed a token"]
    lines = [
        f"the {len(families)} prefix families that missed most tokens "
        "(named by the first words of their text, else by the name given them with kvscope "
        "names, else by the tenant and request that first stored them):"
    ]
    width = max(len(shown(family["name"])) for family in families)
    for family in families:
        lost = ", ".join(f"{cause['name']} {cause['tokens']:,}" for cause in family["causes"][:3])
        lines.append(
            f"  {shown(family['name']):<{width}}  {family['missed_tokens']:>9,} tokens "
            f"({_percent(family['share_of_prompt_tokens'])} of all) in "
            f"{_count(family['requests'], 'request')}; lost to {lost}"
        )
        if family["text"]:
            lines.append(f'      its first block: "{shown(family["text"], limit=TEXT_WIDTH)}"')
    return lines


def request_lines(document: dict[str, Any]) -> list[str]:
    """One request: who it is, then per lookup its causes and its missed blocks."""
    tenant = document["tenant"]
    who = f"tenant {shown(nickname(tenant))}" if tenant else "no tenant"
    lines = [
        f"request {shown(document['request'])} ({who}) in {shown(document['run'])}: "
        f"{document['prompt_tokens']:,} prompt tokens, block size {document['block_size']}, "
        f"{_count(document['preemptions'], 'preemption')}"
    ]
    if not document["lookups"]:
        lines.append("no lookup: the request was never scheduled")
    if document["text_from"] is None:
        lines.append(
            "(no prompt text: the run did not record token ids; replay with --record-token-ids)"
        )
    for lookup in document["lookups"]:
        lines += ["", *_lookup_lines(lookup, document["text_from"])]
    return lines


def _lookup_lines(lookup: dict[str, Any], text_from: str | None) -> list[str]:
    engine = shown(lookup["engine"]) or "-"
    resumed = ", resuming it after a preemption" if lookup["resumes_preemption"] else ""
    lines = [
        f"lookup at {lookup['at_s']:.3f} s on engine {engine} rank {lookup['rank']}{resumed}: "
        f"{lookup['prompt_tokens']:,} prompt tokens"
    ]
    width = max(len(cause["name"]) for cause in lookup["causes"])
    for cause in lookup["causes"]:
        described = describe(cause["details"])
        lines.append(
            f"  {cause['name']:<{width}}  {cause['tokens']:>7,} tokens  {described}".rstrip()
        )
    if lookup["blocks"]:
        lines.append(
            f"  missed blocks (prompt text from {text_from}):" if text_from else "  missed blocks:"
        )
    for first, last in _runs(lookup["blocks"]):
        block, last_block = lookup["blocks"][first], lookup["blocks"][last]
        positions = (
            f"block {block['position']}"
            if first == last
            else f"blocks {block['position']}-{last_block['position']}"
        )
        lines.append(f"    {positions}: {_named(block['name'], block['details'])}")
        if block["text"] is not None:
            more = " ..." if first != last else ""
            lines.append(f'      "{shown(block["text"], limit=TEXT_WIDTH)}"{more}')
    return lines


def _runs(blocks: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """Consecutive blocks alike (cause, state, details) as (first, last) indexes."""
    runs: list[tuple[int, int]] = []
    for index, block in enumerate(blocks):
        if runs:
            first, last = runs[-1]
            previous = blocks[last]
            alike = (previous["cause"], previous["state"], previous["details"]) == (
                block["cause"],
                block["state"],
                block["details"],
            )
            if alike and block["position"] == previous["position"] + 1:
                runs[-1] = (first, index)
                continue
        runs.append((index, index))
    return runs


def describe(details: dict[str, Any]) -> str:
    """A cause's details in words: by whom (request, tenant, prefix family) and how long
    before the lookup it was evicted, under which key it was cached, on which engine, why it
    is unexplained; "" when it has none."""
    parts = []
    if "evicted_by" in details:
        whose = [
            f"tenant {shown(nickname(details['evicted_by_tenant']))}"
            if details.get("evicted_by_tenant")
            else "no tenant"
        ]
        if details.get("evicted_by_family_name"):
            whose.append(f"prefix family {shown(details['evicted_by_family_name'])}")
        parts.append(f"by request {shown(details['evicted_by'])} ({', '.join(whose)})")
    if "evicted_ago_s" in details:
        parts.append(f"{_duration(details['evicted_ago_s'])} before the lookup")
    if "evicted_on" in details:
        parts.append(f"on engine {shown(details['evicted_on'])}")
    if "key_kind" in details:
        kind = KEY_KINDS.get(details["key_kind"], shown(details["key_kind"]))
        parts.append(f"cached under another {kind}")
    if "other_engine" in details:
        parts.append(f"cached on engine {shown(details['other_engine'])}")
    if "why" in details:
        parts.append(details["why"])
    return ", ".join(parts)


def _named(name: str, details: dict[str, Any]) -> str:
    described = describe(details)
    return f"{name}: {described}" if described else name


def _count(number: int, noun: str) -> str:
    return f"{number:,} {noun}" + ("" if number == 1 else "s")


def _duration(seconds: float) -> str:
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:,.2f} s"


def _percent(share: float) -> str:
    return "<0.1 %" if 0 < share < 0.0005 else f"{share * 100:.1f} %"
