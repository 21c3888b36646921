"""Cache policies on the block stream (collector/model/policies.py): the LRU replay hits what
vLLM's own KV cache manager hits, pinning and admission keep a trace built for them (hits known
by hand), and Belady's MIN is never below any policy."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.model.mrc import miss_ratio_curve
from collector.model.policies import (
    POLICIES,
    hottest_families,
    one_off_families,
    replay_policy,
)
from collector.store.run_file import RunFile
from tests.support.block_manager import tiny_run
from tests.support.streams import BLOCK_SIZE, hot_and_scan, stream_of


def test_pinning_and_admission_keep_a_hot_prompt_that_lru_loses() -> None:
    stream = hot_and_scan()
    prompt_tokens = 13 * 13
    # 7 usable blocks, 4 per request: the two scans between H's visits need 8, so LRU evicts
    # H's 3 blocks every time and nothing ever hits.
    lru = replay_policy(stream, BLOCK_SIZE, 8, "lru")
    assert lru.hit_blocks == 0
    # H's 3 blocks pinned after its first visit leave the scans 4 blocks, enough: each of
    # H's 4 later visits hits 3 blocks.
    (hot,) = hottest_families(stream, BLOCK_SIZE, 1)
    pinned = replay_policy(stream, BLOCK_SIZE, 8, "pin", pinned=hot)
    assert (pinned.hit_blocks, pinned.pinned_blocks) == (12, 3)
    assert pinned.token_hit_ratio == pytest.approx(12 * 4 / prompt_tokens)
    # Not caching the scans (never reused) leaves H cached: the same 12 hits.
    one_offs = one_off_families(stream, BLOCK_SIZE, window=100)
    assert len(one_offs) == 8 and hot not in one_offs
    admitted = replay_policy(
        stream, BLOCK_SIZE, 8, "admit", not_admitted=[key for keys in one_offs for key in keys]
    )
    assert admitted.hit_blocks == 12
    # Belady's MIN evicts the scans' blocks (never hit again) first: 12, the most possible.
    assert replay_policy(stream, BLOCK_SIZE, 8, "min").hit_blocks == 12
    # With room for H and both scans (3 + 8 blocks), LRU keeps H too.
    assert replay_policy(stream, BLOCK_SIZE, 12, "lru").hit_blocks == 12


def test_a_pin_budget_pins_no_more_than_it_allows() -> None:
    stream = hot_and_scan()
    (hot,) = hottest_families(stream, BLOCK_SIZE, 1)
    partly = replay_policy(stream, BLOCK_SIZE, 8, "pin", pinned=hot, max_pinned=1)
    assert partly.pinned_blocks == 1
    assert partly.hit_blocks == 4  # only H's first block survives the scans


def test_bad_policies_and_pools_are_refused() -> None:
    stream = hot_and_scan()
    with pytest.raises(ValueError, match="unknown policy"):
        replay_policy(stream, BLOCK_SIZE, 8, "fifo")
    with pytest.raises(ValueError, match="needs more than the 4 blocks"):
        replay_policy(stream, BLOCK_SIZE, 4, "lru")


def random_prompts(seed: int, count: int) -> list[list[int]]:
    """Prompts built from a few shared openings and random tails: prefixes repeat, grow
    apart and come back, with lengths that leave partial blocks and exact multiples."""
    rng = random.Random(seed)
    openings = [[rng.randrange(1, 50) for _ in range(rng.randint(2, 14))] for _ in range(4)]
    prompts = []
    for _ in range(count):
        prompt = list(rng.choice(openings))
        prompt += [rng.randrange(1, 6) for _ in range(rng.randint(1, 10))]
        prompts.append(prompt)
    return prompts


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), count=st.integers(1, 40), extra=st.integers(0, 30))
def test_min_is_never_below_any_policy(seed: int, count: int, extra: int) -> None:
    stream = stream_of(random_prompts(seed, count), output_length=random.Random(seed).randint(1, 6))
    num_blocks = miss_ratio_curve(stream, BLOCK_SIZE).min_num_blocks + extra
    results = {
        policy: replay_policy(
            stream,
            BLOCK_SIZE,
            num_blocks,
            policy,
            pinned=[key for keys in hottest_families(stream, BLOCK_SIZE, 1) for key in keys],
            not_admitted=[key for keys in one_off_families(stream, BLOCK_SIZE, 5) for key in keys],
        ).hit_blocks
        for policy in POLICIES
    }
    assert results["min"] == max(results.values())


@pytest.mark.vllm
@pytest.mark.parametrize(("seed", "count"), [(309, 30), (7, 40), (11, 25), (2026, 40)])
def test_lru_hits_what_vllm_hits(tmp_path: Path, seed: int, count: int) -> None:
    """The LRU replay against vLLM's own KV cache manager (kvscope replay, one request at a
    time), at every pool size from the smallest to where nothing more hits."""
    prompts, output_length = random_prompts(seed, count), random.Random(seed).randint(1, 6)
    stream = stream_of(prompts, output_length)
    curve = miss_ratio_curve(stream, BLOCK_SIZE)
    rows = [
        {"request_id": f"r{index}", "timestamp": index, "token_ids": prompt,
         "output_length": output_length}
        for index, prompt in enumerate(prompts)
    ]  # fmt: skip
    for num_blocks in range(curve.min_num_blocks, curve.saturation_num_blocks + 3):
        directory = tmp_path / str(num_blocks)
        directory.mkdir()
        run = tiny_run(directory, rows, block_size=BLOCK_SIZE, num_blocks=num_blocks)
        with RunFile.open(run) as run_file:
            vllm_hits = run_file.row("SELECT sum(num_hit_blocks) FROM requests")
        lru = replay_policy(stream, BLOCK_SIZE, num_blocks, "lru")
        assert vllm_hits is not None
        assert lru.hit_blocks == vllm_hits[0], num_blocks
