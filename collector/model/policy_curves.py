"""Cache policies across pool sizes: at each size, the token hit ratio of vLLM's LRU, of LRU
with the hottest prefix families pinned, of LRU that leaves one-off families uncached, and of
Belady's MIN (the ceiling no policy that keeps prefixes can pass), all replayed on one run's
block stream one request at a time (collector/model/policies.py).

How far LRU is from the ceiling is what the traffic leaves a cache policy to win: nothing when
LRU reaches NEAR_CEILING of MIN's hits, a lot when the gap is LOT_TO_WIN of token hit ratio or
more. The advisor's cache-policy rule reads the same settings at the run's own size.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from collector.model.block_stream import RequestBlocks
from collector.model.kv_memory import KVSpec, gib_for_blocks
from collector.model.mrc import miss_ratio_curve
from collector.model.policies import (
    PolicyResult,
    check_replay_size,
    hottest_families,
    one_off_families,
    replay_policy,
)

PIN_FAMILIES = 5
ADMISSION_WINDOW = 100  # requests
MAX_BLOCK_REFERENCES = 2_000_000  # a replay of this many takes about 10 s here
POLICY_REPLAYS = "its policy replays take in a few seconds"
NEAR_CEILING = 0.95  # LRU this close to MIN leaves no policy anything to win
# Of token hit ratio: a tenth of all prompt tokens recomputed under LRU that a policy knowing
# the future would serve from the cache (5 times the gain the advisor's rule fires at).
LOT_TO_WIN = 0.10
SIZE_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)  # of the run's own pool


@dataclass(frozen=True)
class PolicyPoint:
    """The four policies at one pool size."""

    lru: PolicyResult
    pin: PolicyResult
    admit: PolicyResult
    ceiling: PolicyResult  # Belady's MIN

    @property
    def num_blocks(self) -> int:
        return self.lru.num_blocks

    @property
    def lru_share(self) -> float:
        """LRU's hit blocks as a share of the ceiling's (1 where nothing can hit)."""
        return self.lru.hit_blocks / self.ceiling.hit_blocks if self.ceiling.hit_blocks else 1.0

    @property
    def gap(self) -> float:
        """Token hit ratio between LRU and the ceiling: what a policy could win at most."""
        return self.ceiling.token_hit_ratio - self.lru.token_hit_ratio


@dataclass(frozen=True)
class PolicyCurves:
    """The policies at each pool size that holds the stream's largest request, the sizes left
    out because they do not, and the families pinning and admission act on."""

    block_size: int
    run_num_blocks: int
    smallest_num_blocks: int  # the largest request's blocks and vLLM's null block
    points: tuple[PolicyPoint, ...]
    skipped_sizes: tuple[int, ...]
    pinned_families: int
    one_off_families: int

    def at(self, num_blocks: int) -> PolicyPoint | None:
        return next((point for point in self.points if point.num_blocks == num_blocks), None)

    def rows(self, spec: KVSpec | None = None) -> list[dict[str, Any]]:
        """One row per pool size: blocks (GiB per GPU with a KV spec), each policy's token
        hit ratio, and LRU's share of the ceiling."""
        rows = []
        for point in self.points:
            row: dict[str, Any] = {"num_blocks": point.num_blocks}
            if spec is not None:
                row["gib"] = gib_for_blocks(spec, self.block_size, point.num_blocks)
            row |= {
                "lru": point.lru.token_hit_ratio,
                "pin": point.pin.token_hit_ratio,
                "admit": point.admit.token_hit_ratio,
                "min": point.ceiling.token_hit_ratio,
                "lru_share": point.lru_share,
            }
            rows.append(row)
        return rows

    def skipped_reason(self) -> str:
        """Which sizes were left out and why, in words ("" when none was)."""
        if not self.skipped_sizes:
            return ""
        *others, last = [f"{size:,}" for size in self.skipped_sizes]
        sizes = f"{', '.join(others)} and {last}" if others else last
        return (
            f"pools of {sizes} blocks are left out: the largest request needs "
            f"{self.smallest_num_blocks - 1:,} blocks besides vLLM's null block"
        )


@dataclass(frozen=True)
class Verdict:
    """How much the traffic leaves a cache policy to win at the run's own size: "nothing",
    "some", "a lot", or "unknown" (the replay cannot hold the run at that size)."""

    room: str
    text: str


def policy_curves(
    stream: Sequence[RequestBlocks],
    block_size: int,
    num_blocks: int,
    sizes: Sequence[int] | None = None,
) -> PolicyCurves:
    """Replay LRU, pinning, admission and MIN at each of `sizes` (default
    `default_pool_sizes`), leaving out sizes too small for the largest request (replay_policy
    refuses them); ReplayTooLarge past MAX_BLOCK_REFERENCES, as the advisor's rule."""
    check_replay_size(stream, MAX_BLOCK_REFERENCES, POLICY_REPLAYS)
    smallest = 1 + max((request.num_blocks for request in stream), default=0)
    if sizes is None:
        saturation = miss_ratio_curve(stream, block_size).saturation_num_blocks
        sizes = default_pool_sizes(num_blocks, saturation)
    pinned = hottest_families(stream, block_size, PIN_FAMILIES)
    one_offs = one_off_families(stream, block_size, ADMISSION_WINDOW)
    pinned_keys, one_off_keys = _keys(pinned), _keys(one_offs)
    held = sorted(size for size in set(sizes) if size >= smallest)
    points = tuple(_point(stream, block_size, size, pinned_keys, one_off_keys) for size in held)
    return PolicyCurves(
        block_size=block_size,
        run_num_blocks=num_blocks,
        smallest_num_blocks=smallest,
        points=points,
        skipped_sizes=tuple(sorted(size for size in set(sizes) if size < smallest)),
        pinned_families=len(pinned),
        one_off_families=len(one_offs),
    )


def default_pool_sizes(num_blocks: int, saturation_num_blocks: int) -> list[int]:
    """The run's pool times each of SIZE_FACTORS, none past the larger of the run's pool and
    the size where LRU already holds all it could ever hit (every policy ties there)."""
    cap = max(num_blocks, saturation_num_blocks)
    return sorted({min(max(round(num_blocks * factor), 1), cap) for factor in SIZE_FACTORS})


def verdict(curves: PolicyCurves) -> Verdict:
    """In plain words, at the run's own size: how close LRU is to the ceiling, what that
    leaves a cache policy to win, and how much of it pinning and admission take."""
    point = curves.at(curves.run_num_blocks)
    if point is None:
        return Verdict(
            "unknown",
            f"The policy replay cannot hold this run at its own {curves.run_num_blocks:,} "
            f"blocks: its largest request needs {curves.smallest_num_blocks - 1:,} blocks "
            "besides vLLM's null block.",
        )
    lru, ceiling = point.lru.token_hit_ratio, point.ceiling.token_hit_ratio
    reach = (
        f"At the run's {point.num_blocks:,} blocks LRU (vLLM's policy) reaches "
        f"{point.lru_share:.0%} of the ceiling ({lru:.1%} token hit ratio against Belady's "
        f"{ceiling:.1%})"
    )
    if point.lru_share >= NEAR_CEILING:
        beyond = (
            "LRU already hits all that any policy could"
            if point.lru.hit_blocks >= point.ceiling.hit_blocks
            else f"no policy, even one that knew the future, would win more than "
            f"{point.gap * 100:.1f} points here"
        )
        return Verdict(
            "nothing", f"{reach}: this traffic leaves nothing for a cache policy to win; {beyond}."
        )
    room = "a lot" if point.gap >= LOT_TO_WIN else "some"
    size = "a lot" if room == "a lot" else f"some; {LOT_TO_WIN * 100:.0f} or more is a lot"
    return Verdict(
        room,
        f"{reach}: this traffic leaves {point.gap * 100:.1f} points of token hit ratio for a "
        f"cache policy to win ({size}). {_simple_policies(curves, point)}.",
    )


def _simple_policies(curves: PolicyCurves, point: PolicyPoint) -> str:
    """What pinning and admission take of the gap, in points of token hit ratio, and what
    only foresight would take."""
    lru = point.lru.token_hit_ratio
    admitted = (
        f"leaving {_families(curves.one_off_families, 'one-off')} uncached "
        f"{(point.admit.token_hit_ratio - lru) * 100:+.1f}"
        if curves.one_off_families
        else f"admission control nothing (every family comes back within {ADMISSION_WINDOW} "
        "requests)"
    )
    best = max(point.pin.hit_blocks, point.admit.hit_blocks)
    rest = (
        "the better of them reaches the ceiling"
        if best >= point.ceiling.hit_blocks
        else "the rest needs knowing which prefixes come back, and when"
    )
    return (
        f"What simple policies take of it: pinning {_families(curves.pinned_families, 'hottest')} "
        f"{(point.pin.token_hit_ratio - lru) * 100:+.1f} points, {admitted}; {rest}"
    )


def _point(
    stream: Sequence[RequestBlocks],
    block_size: int,
    num_blocks: int,
    pinned: list[Hashable],
    not_admitted: list[Hashable],
) -> PolicyPoint:
    return PolicyPoint(
        lru=replay_policy(stream, block_size, num_blocks, "lru"),
        pin=replay_policy(stream, block_size, num_blocks, "pin", pinned=pinned),
        admit=replay_policy(stream, block_size, num_blocks, "admit", not_admitted=not_admitted),
        ceiling=replay_policy(stream, block_size, num_blocks, "min"),
    )


def _keys(families: list[list[Hashable]]) -> list[Hashable]:
    return [key for keys in families for key in keys]


def _families(count: int, kind: str) -> str:
    return f"the {kind} prefix family" if count == 1 else f"the {count:,} {kind} prefix families"
