"""Pinning and admission: what a policy other than vLLM's LRU would win on this run.

The run's own block stream is replayed one request at a time (collector/model/policies.py)
at its pool size under LRU, with the hottest prefix families pinned, with the families that
no request reuses soon left uncached, and under Belady's MIN, the ceiling. The rule fires
when pinning or admission wins at least MIN_GAIN of token hit ratio. vLLM has no pinning or
admission flag, so the action names what an operator can do instead. A run of several engines
(several pools) is not judged.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from collector.advisor.context import RunContext
from collector.advisor.suggestion import (
    NotApplicable,
    NothingToWin,
    Suggestion,
    severity_for_gain,
)
from collector.model.kv_memory import gib_for_blocks
from collector.model.policies import (
    PolicyResult,
    ReplayTooLarge,
    check_replay_size,
    hottest_families,
    one_off_families,
    replay_policy,
)
from collector.model.policy_curves import (
    ADMISSION_WINDOW,
    MAX_BLOCK_REFERENCES,
    NEAR_CEILING,
    PIN_FAMILIES,
    POLICY_REPLAYS,
)

MIN_GAIN = 0.02  # of token hit ratio: 2 points


@dataclass(frozen=True)
class PolicyReplays:
    """The run's block stream at its pool under LRU, with the hottest families pinned, with
    the one-off families left uncached, and under Belady's MIN; the families each changes."""

    lru: PolicyResult
    pin: PolicyResult
    admit: PolicyResult
    ceiling: PolicyResult
    pinned: list[list[Hashable]]  # the hottest families' blocks
    one_offs: list[list[Hashable]]  # the families no request reuses soon

    @property
    def best(self) -> PolicyResult:
        """Pinning or admission, whichever hits more (pinning on a tie)."""
        return self.pin if self.pin.token_hit_ratio >= self.admit.token_hit_ratio else self.admit

    @property
    def gain(self) -> float:
        """Points of token hit ratio the better of them wins over LRU."""
        return self.best.token_hit_ratio - self.lru.token_hit_ratio


def cache_policy(context: RunContext) -> list[Suggestion]:
    """One suggestion when pinning or admission beats LRU by MIN_GAIN or more."""
    replays = replay_policies(context)
    if replays.gain < MIN_GAIN:
        raise NothingToWin(_nothing_to_win(replays))
    return [_suggestion(context, replays)]


def replay_policies(context: RunContext) -> PolicyReplays:
    """The run's block stream replayed one request at a time under each policy compared;
    NotApplicable where it cannot be."""
    if context.num_engines > 1:
        raise NotApplicable(
            f"this run has {context.num_engines} engines, each with its own pool; the policy "
            "replay models one pool (replay each engine's share of the trace, or compare "
            "routers with the routing rule)"
        )
    stream, block_size, num_blocks = context.block_stream, context.block_size, context.num_blocks
    try:
        check_replay_size(stream, MAX_BLOCK_REFERENCES, POLICY_REPLAYS)
    except ReplayTooLarge as error:
        raise NotApplicable(str(error)) from None
    pinned = hottest_families(stream, block_size, PIN_FAMILIES)
    one_offs = one_off_families(stream, block_size, ADMISSION_WINDOW)
    try:
        return PolicyReplays(
            lru=replay_policy(stream, block_size, num_blocks, "lru"),
            pin=replay_policy(
                stream, block_size, num_blocks, "pin", pinned=[k for keys in pinned for k in keys]
            ),
            admit=replay_policy(
                stream,
                block_size,
                num_blocks,
                "admit",
                not_admitted=[key for keys in one_offs for key in keys],
            ),
            ceiling=replay_policy(stream, block_size, num_blocks, "min"),
            pinned=pinned,
            one_offs=one_offs,
        )
    except ValueError as error:
        raise NotApplicable(f"the policy replay cannot hold this run: {error}") from None


def _suggestion(context: RunContext, replays: PolicyReplays) -> Suggestion:
    lru, pin, admit, ceiling = replays.lru, replays.pin, replays.admit, replays.ceiling
    gain, best = replays.gain, replays.best
    gain_tokens = gain * context.prompt_tokens
    pinned_gib = gib_for_blocks(context.spec, context.block_size, pin.pinned_blocks)
    what = _what(replays)
    return Suggestion(
        rule="cache-policy",
        title=f"{what[0].upper()}{what[1:]} would win {gain * 100:.1f} points",
        severity=severity_for_gain(gain),
        evidence=_evidence(context, replays, pinned_gib),
        effect=(
            f"token hit ratio {lru.token_hit_ratio:.1%} -> {best.token_hit_ratio:.1%} "
            f"(+{gain * 100:.1f} points, about {gain_tokens:,.0f} more prompt tokens served "
            "from the cache over this run), per a replay of this run's block stream one "
            "request at a time"
        ),
        action=(
            "vLLM has no pinning or admission flag today; to the same end: keep the hot "
            "families warm (a one-token request with their prefix while idle), route them "
            "to replicas of their own so one-off traffic does not evict them, or add a CPU "
            "tier (--kv-offloading-size) that catches what the GPU pool evicts"
        ),
        gain_tokens=gain_tokens,
        figures={
            "lru_token_hit_ratio": lru.token_hit_ratio,
            "pin_token_hit_ratio": pin.token_hit_ratio,
            "admit_token_hit_ratio": admit.token_hit_ratio,
            "ceiling_token_hit_ratio": ceiling.token_hit_ratio,
            "pinned_blocks": pin.pinned_blocks,
            "pinned_gib": pinned_gib,
            "one_off_families": len(replays.one_offs),
        },
    )


def _what(replays: PolicyReplays) -> str:
    """What the better policy does, in words."""
    pinned = replays.pinned
    families = "hottest prefix family" if len(pinned) == 1 else f"{len(pinned)} hottest families"
    if replays.best is replays.pin:
        return f"pinning the {families}"
    return (
        f"not caching the {len(replays.one_offs):,} prefix families no request reuses within "
        f"{ADMISSION_WINDOW} requests"
    )


def _evidence(context: RunContext, replays: PolicyReplays, pinned_gib: float) -> list[str]:
    lru, pin, admit, ceiling = replays.lru, replays.pin, replays.admit, replays.ceiling
    roots = ", ".join(f"{keys[0]:#018x}" for keys in replays.pinned if isinstance(keys[0], int))
    return [
        f"LRU (vLLM's policy) at the run's {context.num_blocks:,} blocks: "
        f"{lru.token_hit_ratio:.1%} token hit ratio, one request at a time",
        _line("pinning the hottest families", pin)
        + f" ({pin.pinned_blocks:,} blocks pinned, {pinned_gib:.2f} GiB; first "
        f"blocks {roots})",
        _line("leaving one-off families uncached", admit)
        + f" ({len(replays.one_offs):,} families)",
        f"the ceiling (Belady's MIN, perfect knowledge of the future): "
        f"{ceiling.token_hit_ratio:.1%}; LRU reaches "
        f"{_share(lru, ceiling):.0%} of it",
    ]


def _nothing_to_win(replays: PolicyReplays) -> str:
    """The silent verdict in plain words: how far LRU is from the ceiling, and what pinning
    and admission would change."""
    lru, pin, admit, ceiling = replays.lru, replays.pin, replays.admit, replays.ceiling
    reach = _share(lru, ceiling)
    verdict = (
        "this traffic leaves nothing for a cache policy to win"
        if reach >= NEAR_CEILING
        else "a policy that knew the future would win more, but neither pinning nor "
        f"admission wins {MIN_GAIN * 100:.0f} points"
    )
    return (
        f"LRU reaches {reach:.0%} of the ceiling ({lru.token_hit_ratio:.1%} against "
        f"Belady's {ceiling.token_hit_ratio:.1%}); pinning "
        f"{(pin.token_hit_ratio - lru.token_hit_ratio) * 100:+.1f} points, admission "
        f"{(admit.token_hit_ratio - lru.token_hit_ratio) * 100:+.1f}: {verdict}"
    )


def _line(what: str, result: PolicyResult) -> str:
    return f"{what}: {result.token_hit_ratio:.1%}"


def _share(result: PolicyResult, ceiling: PolicyResult) -> float:
    return result.hit_blocks / ceiling.hit_blocks if ceiling.hit_blocks else 1.0
