"""Collision detection finds exactly the wrong reuses, and none with vLLM's real hash."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

from collector.replay.block_manager import CacheSettings, make_kv_cache_manager, make_request
from collector.replay.replayer import ReplayOptions, replay
from engine_hooks.events import Collision
from tests.support.block_manager import make_hooks
from tests.support.repo import SECRET

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version

BLOCK_SIZE = 4


def weak_hash(value: Any) -> bytes:
    """vLLM's sha256, truncated to 8 bits: 256 possible block hashes, collisions galore."""
    return sha256(value)[:1]


def prompts(count: int) -> list[list[int]]:
    """Prompts over a tiny vocabulary, half of them extending one of a few shared prefixes."""
    rng = random.Random(3)
    shared = [[rng.randrange(6) for _ in range(BLOCK_SIZE * 3)] for _ in range(4)]
    result = []
    for _ in range(count):
        head = rng.choice(shared) if rng.random() < 0.5 else []
        tail = [rng.randrange(6) for _ in range(rng.randrange(1, 6) * BLOCK_SIZE)]
        result.append(head + tail)
    return result


def test_detector_reports_exactly_the_wrong_reuses() -> None:
    init_none_hash(weak_hash)
    block_hasher = get_request_block_hasher(BLOCK_SIZE, weak_hash)
    manager = make_kv_cache_manager(CacheSettings(BLOCK_SIZE, 48))
    hooks, buffer = make_hooks(manager, check_collisions=True)
    hooks.attach()
    # The test's own witness: which prefix each cached block really holds.
    content: dict[int, tuple[int, ...]] = {}
    # A weak hash can even send two positions of one prompt to the same cached block.
    wrong_reuses: Counter[tuple[str, int]] = Counter()
    right_reuses = 0
    for index, tokens in enumerate(prompts(400)):
        request = make_request(f"r{index}", tokens, block_hasher)
        computed, num_hit_tokens, _ = manager.get_computed_blocks(request)
        hit_ids = computed.get_block_ids()[0]
        assert manager.allocate_slots(
            request, request.num_tokens - num_hit_tokens, num_hit_tokens, computed
        )
        for position, block_id in enumerate(hit_ids):
            if content[block_id] != tuple(tokens[: (position + 1) * BLOCK_SIZE]):
                wrong_reuses[(request.request_id, block_id)] += 1
            else:
                right_reuses += 1
        block_ids = manager.get_block_ids(request.request_id)[0]
        for position in range(len(hit_ids), len(tokens) // BLOCK_SIZE):
            content[block_ids[position]] = tuple(tokens[: (position + 1) * BLOCK_SIZE])
        request.num_computed_tokens = request.num_tokens
        manager.free(request)
    hooks.detach()
    init_none_hash(sha256)

    reported = [record for record in buffer.take() if isinstance(record, Collision)]
    assert wrong_reuses.total() > 20, "the weak hash must make vLLM reuse wrong blocks"
    assert right_reuses > 20, "and right ones too"
    assert Counter((record.request_id, record.block_id) for record in reported) == wrong_reuses
    assert all(record.stored_fingerprint != record.request_fingerprint for record in reported)
    assert all(record.stored_by not in (None, record.request_id) for record in reported)


def test_no_false_collisions_with_the_real_hash(mooncake_trace: Path, tmp_path: Path) -> None:
    options = ReplayOptions(settings=CacheSettings(512, 20_000), check_collisions=True)
    summary = replay(mooncake_trace, tmp_path / "run.duckdb", options, SECRET)
    assert summary["block_hits"] > 50_000, "many hits were checked"
    assert summary["collisions"] == 0
