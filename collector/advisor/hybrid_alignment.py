"""Hybrid alignment: prefix hits cut short because one KV cache group lost the end of a prefix.

Under vLLM's hybrid KV cache manager, a sliding-window (or chunked-local) group never
allocates the blocks its window has passed by the end of a prefill (vLLM's null blocks), and
frees those it passes later, first in line for eviction; so a later request sharing only
part of an earlier prompt often finds the full-attention group holding that part while the
window group holds nothing at its end, even in a pool that evicts nothing. The hit is then
cut to where every group agrees (the breakdown's `group_cut` tokens).
`--disable-hybrid-kv-cache-manager` makes every layer keep every block, as full attention:
no hit is cut, but a block then holds every layer, so the same memory holds fewer blocks
(the pool divided by the number of groups, vLLM's groups having equal layers). The rule
weighs the two like for like where it can: a run that recorded its prompts is replayed
through vLLM's own manager one request at a time, once with its own groups and pool and once
all full attention in the smaller pool. A run without its prompts is weighed with the
one-pass curve of its own block hashes at the smaller pool (one request at a time) against
the tokens the run hit; on the sample trace the curve reads within 0.2 points of the
Scheduler's measure at the full-attention sample's pool, but a tiny pool that the run's
overlap thrashes makes the curve read high. Mamba groups exist only under the hybrid
manager. Each replay writes a run file into a temporary folder, removed after.
"""

from __future__ import annotations

from dataclasses import dataclass

from collector.advisor.context import RunContext
from collector.advisor.miss_breakdown import quote_causes
from collector.advisor.replay_folder import replay_folder
from collector.advisor.scheduler_check import MAX_PROMPT_TOKENS, SECRET
from collector.advisor.suggestion import (
    NotApplicable,
    NothingToWin,
    Suggestion,
    severity_for_gain,
)
from collector.queries.kv_groups import describe, layout
from collector.replay.block_manager import CacheSettings
from collector.replay.replayer import ReplayOptions, replay_requests
from engine_hooks.layout import KvGroup

MIN_CUT_SHARE = 0.01  # of the prompt tokens looked up: below it, nothing worth weighing
MIN_GAIN = 0.01  # of token hit ratio: one point


@dataclass(frozen=True)
class AllFullAttention:
    """What the run's pool would be with every layer in one full-attention group, and the
    prefix-hit tokens predicted there (`predicted_tokens`), beside those of the run's own
    groups (`measured_tokens`: its replay, or what the run hit)."""

    num_blocks: int
    predicted_tokens: float
    measured_tokens: float
    cut_tokens: int
    replayed: bool  # both sides replayed through vLLM's manager; else the curve vs the run

    @property
    def gain_tokens(self) -> float:
        return self.predicted_tokens - self.measured_tokens


def hybrid_alignment(context: RunContext) -> list[Suggestion]:
    """One suggestion when turning the hybrid manager off wins MIN_GAIN of token hit ratio."""
    groups = layout(context.run)
    if len(groups) <= 1:
        raise NotApplicable("one KV cache group: no group can cut another's hit short")
    if any(group.kind == "mamba" for group in groups):
        raise NotApplicable(
            "a Mamba group is kept only by vLLM's hybrid KV cache manager, which therefore stays on"
        )
    breakdown = context.miss_breakdown
    if breakdown is None:
        raise NotApplicable("the run recorded no lookups, so no hit was seen cut short")
    cut = breakdown.tokens("group_cut")
    if context.share(cut) < MIN_CUT_SHARE:
        raise NothingToWin(
            f"hits cut short by another KV cache group lost {cut:,} prompt tokens "
            f"({context.share(cut):.1%}), under {MIN_CUT_SHARE:.0%}"
        )
    weighed = weigh_all_full_attention(context, groups, cut)
    if context.share(weighed.gain_tokens) < MIN_GAIN:
        raise NothingToWin(_too_little(context, weighed))
    return [_suggestion(context, groups, weighed)]


def weigh_all_full_attention(
    context: RunContext, groups: list[KvGroup], cut_tokens: int
) -> AllFullAttention:
    """The pool every layer in one group would leave, and its predicted prefix-hit tokens."""
    layers = sum(group.num_layers for group in groups)
    per_group = max(group.num_layers for group in groups)
    num_blocks = context.num_blocks * per_group // layers
    if context.has_token_ids and context.prompt_tokens <= MAX_PROMPT_TOKENS:
        own, all_full = _replayed_hits(context, groups, num_blocks)
        return AllFullAttention(num_blocks, all_full, own, cut_tokens, replayed=True)
    return AllFullAttention(
        num_blocks=num_blocks,
        predicted_tokens=context.tokens_at(context.curve, num_blocks),
        measured_tokens=float(context.summary["hit_tokens"]),
        cut_tokens=cut_tokens,
        replayed=False,
    )


def _replayed_hits(
    context: RunContext, groups: list[KvGroup], num_blocks: int
) -> tuple[float, float]:
    """The run's requests replayed one request at a time through vLLM's manager: prefix-hit
    tokens with its own groups and pool, then all full attention in `num_blocks`."""
    own_layout = ",".join(
        group.kind if group.kind == "full" else f"{group.kind}:{group.window}" for group in groups
    )
    config = context.config
    hits = []
    with replay_folder("the replay") as directory:
        for name, blocks, kv_layout in (
            ("own", context.num_blocks, own_layout),
            ("all-full", num_blocks, "full"),
        ):
            settings = CacheSettings(
                context.block_size, blocks, config["hash_algo"], kv_layout=kv_layout
            )
            options = ReplayOptions(
                settings=settings, timing="sequential", engines=context.num_engines
            )
            out = directory / f"{name}.duckdb"
            summary = replay_requests(context.requests, context.path, out, options, SECRET)
            hits.append(float(summary["hit_tokens"]))
    return hits[0], hits[1]


def _too_little(context: RunContext, weighed: AllFullAttention) -> str:
    return (
        f"hits cut short by another KV cache group lost {weighed.cut_tokens:,} prompt tokens "
        f"({context.share(weighed.cut_tokens):.1%}), but with the hybrid KV cache manager off "
        f"the same memory holds {weighed.num_blocks:,} blocks{context.per_engine}, where "
        f"{_predicted(context, weighed)}: the window's savings are worth more than the cut "
        "hits (a larger pool recovers them: cache-size)"
    )


def _suggestion(
    context: RunContext, groups: list[KvGroup], weighed: AllFullAttention
) -> Suggestion:
    gain = context.share(weighed.gain_tokens)
    quote = quote_causes(context.miss_breakdown, "group_cut")
    kinds = ", ".join(describe(group) for group in groups)
    return Suggestion(
        rule="hybrid-alignment",
        title=(
            f"Hits cut short by a sliding-window group: turning vLLM's hybrid KV cache "
            f"manager off would win {gain * 100:.1f} points"
        ),
        severity=severity_for_gain(gain),
        evidence=[
            f"{len(groups)} KV cache groups share the pool ({kinds}); a window group keeps "
            "no block its window has passed (never allocated, or freed and evicted first), "
            "so a later request sharing part of a prompt finds that part's end missing there",
            *quote.lines,
            f"with every layer in one full-attention group the same memory holds "
            f"{weighed.num_blocks:,} blocks{context.per_engine} instead of "
            f"{context.num_blocks:,}; there {_predicted(context, weighed)}",
        ],
        effect=(
            f"token hit ratio {context.share(weighed.measured_tokens):.1%} -> "
            f"{context.share(weighed.predicted_tokens):.1%} (+{gain * 100:.1f} points), "
            + (
                "per replays of the run's requests through vLLM's manager"
                if weighed.replayed
                else "per the one-pass curve of the run's blocks"
            )
            + " (one request at a time, no overlap)"
        ),
        action=(
            f"serve with --disable-hybrid-kv-cache-manager{context.on_each_engine}; check "
            "the pool vLLM logs at start-up (it holds fewer, larger blocks) and re-measure"
        ),
        gain_tokens=weighed.gain_tokens,
        figures={
            "num_groups": len(groups),
            "all_full_attention_num_blocks": weighed.num_blocks,
            "predicted_token_hit_ratio": context.share(weighed.predicted_tokens),
            "own_groups_token_hit_ratio": context.share(weighed.measured_tokens),
            "replayed": weighed.replayed,
            **quote.figures,
        },
    )


def _predicted(context: RunContext, weighed: AllFullAttention) -> str:
    """The two hit ratios weighed, and how each was had."""
    predicted = context.share(weighed.predicted_tokens)
    own = context.share(weighed.measured_tokens)
    if weighed.replayed:
        return (
            f"the run's requests replayed one at a time through vLLM's manager hit "
            f"{predicted:.1%} of prompt tokens, against {own:.1%} with its own groups and pool"
        )
    return (
        f"the one-pass curve of the run's block hashes predicts {predicted:.1%} token hit "
        f"ratio (one request at a time), against the {own:.1%} the run hit"
    )
