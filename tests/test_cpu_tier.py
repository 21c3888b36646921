"""A CPU tier behind the GPU pool through vLLM's own `CPUOffloadingManager`
(collector/replay/cpu_tier.py), on traces whose tier hits, stores and evictions are known by
hand."""

from __future__ import annotations

import pytest

from collector.model.policies import replay_policy
from collector.replay.cpu_tier import CpuTier
from tests.support.streams import BLOCK_SIZE, stream_of

pytestmark = pytest.mark.vllm


def prompt(number: int) -> list[int]:
    """13 tokens: 3 full blocks of 4 (all hit-eligible) and a partial one."""
    return [number * 100 + token for token in range(1, 14)]


def test_a_cpu_tier_turns_a_thrashing_working_set_into_tier_hits() -> None:
    # Four prompts in turn, 8 rounds, through 7 usable GPU blocks: LRU never keeps one.
    stream = stream_of([prompt(number % 4) for number in range(32)])
    assert replay_policy(stream, BLOCK_SIZE, 8).hit_blocks == 0
    # A 12-block tier holds all four: the first round stores their 12 blocks, and each of the
    # 28 later requests loads its 3 blocks back.
    tier = CpuTier(12, "lru")
    result = replay_policy(stream, BLOCK_SIZE, 8, tier=tier)
    assert (result.hit_blocks, result.tier_hit_blocks) == (0, 28 * 3)
    assert (tier.counts.hits, tier.counts.stores, tier.counts.evictions) == (84, 12, 0)
    assert result.token_hit_ratio == pytest.approx(84 * 4 / (32 * 13))
    assert result.gpu_token_hit_ratio == 0


def scan_and_hot_set() -> list[list[int]]:
    """H0, H1, H0, H1 (each visited twice: ARC's frequent list), then three rounds of three
    one-off scans and a visit to H0 and H1."""
    hot, scans = [prompt(1), prompt(2)], iter(prompt(100 + number) for number in range(9))
    prompts = hot * 2
    for _ in range(3):
        prompts += [next(scans), next(scans), next(scans), *hot]
    return prompts


@pytest.mark.parametrize(
    ("policy", "hits", "stores", "evictions"),
    [
        # LRU: each round's scans (9 blocks) push H0 and H1 out of the 9-block tier; both
        # miss and are stored again: 6 hits (the warm-up), 6 + 3 x 15 stores, 12 + 15 + 15
        # evictions.
        ("lru", 6, 51, 42),
        # ARC: H0's and H1's blocks, reused once, sit in T2; the scans evict each other
        # from T1: 6 + 3 x 6 hits, 6 + 3 x 9 stores, 6 + 9 + 9 evictions.
        ("arc", 24, 33, 24),
    ],
)
def test_arc_keeps_a_hot_set_through_scans_that_lru_loses(
    policy: str, hits: int, stores: int, evictions: int
) -> None:
    stream = stream_of(scan_and_hot_set())
    tier = CpuTier(9, policy)
    # 4 usable GPU blocks: the GPU keeps only the last request's blocks.
    result = replay_policy(stream, BLOCK_SIZE, 5, tier=tier)
    assert result.hit_blocks == 0
    assert (tier.counts.hits, tier.counts.stores, tier.counts.evictions) == (
        hits,
        stores,
        evictions,
    )
    assert result.tier_hit_blocks == hits


def test_bad_tiers_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown tier policy"):
        CpuTier(8, "fifo")
    with pytest.raises(ValueError, match="at least 1 block"):
        CpuTier(0)
