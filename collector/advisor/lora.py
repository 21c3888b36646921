"""LoRA adapters splitting otherwise identical prefixes.

vLLM mixes the adapter into every block hash, rightly: an adapter changes the hidden states
and so the KV of every layer after it. Identical prompts sent under different adapters (or
under an adapter and the base model) therefore keep separate copies of their prefix, and
never hit each other's. Finding them needs the prompts' token ids.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass

from collector.advisor.context import RunContext
from collector.advisor.miss_breakdown import quote_causes
from collector.advisor.suggestion import Chart, Series, Suggestion, severity_for_gain
from collector.model.block_stream import RequestBlocks, trace_block_stream
from collector.model.kv_memory import gib_for_blocks
from collector.model.trace_request import TraceRequest
from collector.safe_text import code

BASE_MODEL = "(base model)"


def _without_adapter(request: TraceRequest) -> Hashable:
    return (None, request.cache_salt)


@dataclass(frozen=True)
class AdapterSplit:
    """Blocks of identical tokens cached under more than one adapter (`split`: each block's
    adapters), the duplicate copies they make, their prefix families (requests, an example
    request id, adapters; largest first), and the prefix-hit tokens one adapter per family
    would add (one-pass curve without the adapter in the hash)."""

    stream: list[RequestBlocks]  # the requests' blocks, keyed without their adapter
    split: dict[Hashable, set[str | None]]
    duplicates: int
    families: list[tuple[int, str, list[str]]]
    gain: float


def adapter_split(context: RunContext) -> AdapterSplit | None:
    """The run's blocks split by adapter, and what merging them would win; None if none is."""
    requests, block_size = context.requests, context.block_size
    stream = trace_block_stream(requests, block_size, _without_adapter)
    split = _split_blocks(requests, stream)
    if not split:
        return None
    now = context.tokens_at(context.token_curve(block_size), context.num_blocks)
    merged = context.tokens_at(
        context.token_curve(block_size, _without_adapter, "one-adapter"), context.num_blocks
    )
    return AdapterSplit(
        stream,
        split,
        duplicates=sum(len(adapters) - 1 for adapters in split.values()),
        families=_split_families(requests, stream, split),
        gain=max(merged - now, 0.0),
    )


def lora_split(context: RunContext) -> list[Suggestion]:
    """Fire when blocks with the same tokens are cached under more than one adapter."""
    found = adapter_split(context)
    return [] if found is None else [_suggestion(context, found)]


def _suggestion(context: RunContext, found: AdapterSplit) -> Suggestion:
    split, duplicates, families, gain = found.split, found.duplicates, found.families, found.gain
    duplicate_gib = gib_for_blocks(context.spec, context.block_size, duplicates)
    quote = quote_causes(context.miss_breakdown, "key_mismatch", key_kind="lora")
    adapter_names = sorted(
        {code(name) if name else BASE_MODEL for adapters in split.values() for name in adapters}
    )
    return Suggestion(
        rule="lora-split",
        title=(
            f"LoRA adapters split identical prefixes ({len(families)} prefix "
            f"famil{'y' if len(families) == 1 else 'ies'})"
        ),
        severity=severity_for_gain(context.share(gain)),
        evidence=[
            f"{len(split):,} distinct blocks of identical tokens were cached under more than "
            f"one adapter ({', '.join(adapter_names)}): {duplicates:,} duplicate blocks "
            f"({duplicate_gib:.2f} GiB) if all stay cached",
            *[
                f"prefix family of {count} requests (e.g. {code(example)}) runs under "
                f"{', '.join(names)}"
                for count, example, names in families[:3]
            ],
            *quote.lines,
        ],
        effect=(
            f"if one adapter (or the base model) served each family, about {gain:,.0f} more "
            f"prompt tokens would come from the cache (+{context.share(gain) * 100:.1f} "
            "points; one-pass curve without the adapter in the hash). The adapter does "
            "change the KV, so vLLM must keep the copies apart otherwise"
        ),
        action=(
            "send each shared-prefix family through one adapter, or route each adapter's "
            "traffic to its own replica; else budget the duplicates: "
            f"`--num-gpu-blocks-override "
            f"{context.num_blocks + _most_in_one_pool(context, duplicates)}`"
            + context.on_each_engine
        ),
        gain_tokens=gain,
        figures={"split_blocks": len(split), "duplicate_blocks": duplicates, **quote.figures},
        charts=[_adapter_chart(context.requests, found.stream, split)],
    )


def _most_in_one_pool(context: RunContext, duplicates: int) -> int:
    """The duplicate blocks one pool holds if all stay cached: on a fleet, the most that any
    engine's own requests make."""
    if context.num_engines == 1:
        return duplicates
    block_size = context.block_size
    return max(
        sum(
            len(adapters) - 1
            for adapters in _split_blocks(
                share, trace_block_stream(share, block_size, _without_adapter)
            ).values()
        )
        for share in context.engine_shares(context.requests)
    )


def _split_blocks(
    requests: list[TraceRequest], stream: list[RequestBlocks]
) -> dict[Hashable, set[str | None]]:
    """Blocks of identical tokens cached under more than one adapter, and those adapters."""
    adapters_by_block: dict[Hashable, set[str | None]] = defaultdict(set)
    for request, blocks in zip(requests, stream, strict=True):
        for key in blocks.keys:
            adapters_by_block[key].add(request.lora)
    return {key: adapters for key, adapters in adapters_by_block.items() if len(adapters) > 1}


def _adapter_chart(
    requests: list[TraceRequest],
    stream: list[RequestBlocks],
    split: dict[Hashable, set[str | None]],
) -> Chart:
    return Chart(
        kind="bar",
        title="Requests per adapter in the split prefix families",
        x_title="adapter",
        y_title="requests",
        series=[Series("requests", *_requests_per_adapter(requests, stream, split))],
    )


def _split_families(
    requests: list[TraceRequest],
    stream: list[RequestBlocks],
    split: dict[Hashable, set[str | None]],
) -> list[tuple[int, str, list[str]]]:
    """Families by first block: (requests, an example request id, adapters), largest first."""
    families: dict[Hashable, list[TraceRequest]] = defaultdict(list)
    for request, blocks in zip(requests, stream, strict=True):
        if blocks.keys and blocks.keys[0] in split:
            families[blocks.keys[0]].append(request)
    return sorted(
        (
            (
                len(members),
                members[0].request_id,
                sorted({code(member.lora) if member.lora else BASE_MODEL for member in members}),
            )
            for members in families.values()
        ),
        reverse=True,
    )


def _requests_per_adapter(
    requests: list[TraceRequest],
    stream: list[RequestBlocks],
    split: dict[Hashable, set[str | None]],
) -> tuple[list[str], list[float]]:
    counts: dict[str, int] = defaultdict(int)
    for request, blocks in zip(requests, stream, strict=True):
        if blocks.keys and blocks.keys[0] in split:
            counts[request.lora or BASE_MODEL] += 1
    names = sorted(counts)
    return names, [float(counts[name]) for name in names]
