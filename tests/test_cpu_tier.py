"""A CPU tier behind the GPU pool through vLLM's own `CPUOffloadingManager`
(collector/replay/cpu_tier.py), on traces whose tier hits, stores and evictions are known by
hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.model.policies import replay_policy
from collector.queries.summary import run_summary
from collector.replay.block_manager import CacheSettings
from collector.replay.cpu_tier import CpuTier
from collector.replay.replayer import ReplayOptions
from collector.store.run_file import RunFile
from tests.support.block_manager import tiny_run
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


def tier_trace(prompts: list[list[int]]) -> list[dict[str, object]]:
    return [
        {"request_id": f"r{index}", "timestamp": index, "token_ids": tokens, "output_length": 1}
        for index, tokens in enumerate(prompts)
    ]


def test_a_replay_through_vllms_manager_loads_the_thrashing_set_back_from_the_tier(
    tmp_path: Path,
) -> None:
    # The same four prompts in turn through vLLM's KVCacheManager (7 usable blocks of 4),
    # the tier beside it as the offloading connector calls it.
    rows = tier_trace([prompt(number % 4) for number in range(32)])
    run = tiny_run(tmp_path, rows, num_blocks=8, cpu_tier_blocks=12)
    with RunFile.open(run) as store:
        summary = run_summary(store)
        per_request = store.rows(
            "SELECT num_hit_tokens, num_tier_hit_tokens FROM requests ORDER BY arrival_ns"
        )
        moves = store.rows(
            "SELECT kind, medium, count(*) FROM vllm_kv_events GROUP BY ALL ORDER BY kind"
        )
        tier = json.loads(store.rows("SELECT options->'cpu_tier' FROM runs")[0][0])
    # No GPU hit ever; every request after the first round loads its 3 full blocks.
    assert (summary["hit_tokens"], summary["tier_hit_tokens"]) == (0, 28 * 3 * BLOCK_SIZE)
    assert per_request == [(0, 0)] * 4 + [(0, 12)] * 28
    assert summary["tier_token_hit_ratio"] == pytest.approx(28 * 12 / (32 * 13))
    # The tier took each prompt's 3 full blocks once and never dropped one.
    assert moves == [("stored", "CPU", 12)]
    assert tier == {"num_blocks": 12, "policy": "lru"}


def test_a_tier_leaves_the_gpu_pool_as_it_was(tmp_path: Path) -> None:
    # One request at a time, the GPU pool holds and hits the same blocks with a tier as
    # without: loaded blocks are cached on the GPU as computed ones are. (vLLM takes a
    # request's loaded blocks from the pool in a call of their own, so its records split
    # differently: the rows compare per request.)
    rows = tier_trace([prompt(number % 5) for number in range(20)])
    (tmp_path / "without").mkdir()
    (tmp_path / "with").mkdir()
    without = tiny_run(tmp_path / "without", rows, num_blocks=10)
    with_tier = tiny_run(
        tmp_path / "with", rows, num_blocks=10, cpu_tier_blocks=15, cpu_tier_policy="arc"
    )
    with RunFile.open(without) as bare, RunFile.open(with_tier) as tiered:
        query = (
            "SELECT request_id, kind, block_id, block_hash FROM events "
            "WHERE block_id IS NOT NULL ORDER BY ALL"
        )
        assert bare.rows(query) == tiered.rows(query)
        assert run_summary(tiered)["tier_hit_tokens"] > 0


def test_a_tier_needs_a_full_attention_layout() -> None:
    with pytest.raises(ValueError, match="one full-attention KV cache group"):
        ReplayOptions(settings=CacheSettings(16, 100, kv_layout="gpt-oss"), cpu_tier_blocks=8)
    with pytest.raises(ValueError, match="unknown --cpu-tier-policy"):
        ReplayOptions(cpu_tier_blocks=8, cpu_tier_policy="fifo")
