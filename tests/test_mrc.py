"""The one-pass miss-ratio curve against replays through vLLM's real KV cache manager."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from collector.model.block_stream import trace_block_stream
from collector.model.mrc import miss_ratio_curve
from collector.model.trace_request import TraceRequest
from collector.queries.requests import run_block_stream
from collector.replay.block_manager import CacheSettings, make_block_hasher, make_kv_cache_manager
from collector.replay.replayer import ReplayOptions
from collector.replay.simulator import Simulator, VirtualClock
from collector.replay.sweep_point import SweepPoint
from collector.replay.traces import read_trace
from collector.replay.whatif import Source, run_sweep
from collector.store.run_file import RunFile
from tests.support.block_manager import tiny_run
from tests.support.repo import SECRET

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version


def replayed_hit_blocks(requests: list[TraceRequest], block_size: int, num_blocks: int) -> int:
    """Prefix-hit blocks of a sequential replay through a real manager (vLLM's own stats)."""
    settings = CacheSettings(block_size, num_blocks)
    manager = make_kv_cache_manager(settings)
    simulator = Simulator(
        manager, None, VirtualClock(), make_block_hasher(settings), on_step=lambda: None
    )
    simulator.run_sequential(requests, lambda _: None)
    return int(manager.make_prefix_cache_stats().hits) // block_size


def numbered_request(index: int, tokens: list[int], **fields: Any) -> TraceRequest:
    """Request `index` of a synthetic trace, one a millisecond, its prompt `tokens`."""
    return TraceRequest(
        line=index + 1,
        request_id=f"r{index}",
        timestamp_ms=float(index),
        num_prompt_tokens=len(tokens),
        token_ids=tuple(tokens),
        **fields,
    )


def shared_prefix_trace(seed: int, num_requests: int = 150) -> list[TraceRequest]:
    """Prompts built from a few shared prefixes of random lengths, LoRA on some, outputs."""
    rng = random.Random(seed)
    prefixes = [
        [rng.randrange(1_000, 30_000) for _ in range(rng.randint(5, 120))] for _ in range(8)
    ]
    requests = []
    for index in range(num_requests):
        tokens = list(rng.choice(prefixes))
        if rng.random() < 0.5:
            tokens += rng.choice(prefixes)
        tokens += [rng.randrange(1_000, 30_000) for _ in range(rng.randint(0, 40))]
        requests.append(
            numbered_request(
                index,
                tokens,
                output_length=rng.choice([0, 1, 2, 5, 17, 40]),
                lora=rng.choice([None, None, "adapter"]),
            )
        )
    return requests


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("block_size", [4, 16])
def test_curve_equals_vllm_replays_at_every_tried_size(seed: int, block_size: int) -> None:
    requests = shared_prefix_trace(seed)
    curve = miss_ratio_curve(trace_block_stream(requests, block_size), block_size)
    smallest = curve.min_num_blocks
    sizes = sorted({smallest, smallest + 1, smallest + 7, smallest * 2, smallest * 4, 1 << 20})
    for num_blocks in sizes:
        assert curve.hits_at(num_blocks) == replayed_hit_blocks(requests, block_size, num_blocks), (
            num_blocks
        )
    assert curve.hits_at(1 << 20) > curve.hits_at(smallest) > 0


def repeated_block_trace(seed: int) -> list[TraceRequest]:
    """Prompts of whole blocks repeated exactly, and repeated outputs: vLLM computes the last
    block of a fully cached prompt again and keeps both copies (the curve's hardest case)."""
    rng = random.Random(seed)
    prefixes = [
        [rng.randrange(1_000, 3_000) for _ in range(8 * rng.randint(1, 12))] for _ in range(6)
    ]
    outputs = [
        tuple(rng.randrange(1_000, 3_000) for _ in range(rng.randint(1, 30))) for _ in range(4)
    ]
    requests = []
    for index in range(200):
        tokens = list(rng.choice(prefixes))
        if rng.random() < 0.3:
            tokens += [rng.randrange(1_000, 3_000) for _ in range(rng.randint(1, 20))]
        output = rng.choice(outputs) if rng.random() < 0.4 else None
        requests.append(
            numbered_request(
                index,
                tokens,
                output_length=len(output) if output else rng.choice([0, 1, 3, 9]),
                output_token_ids=output,
                cache_salt=rng.choice([None, None, "salt"]),
            )
        )
    return requests


def test_curve_stays_close_when_vllm_keeps_duplicate_copies() -> None:
    requests = repeated_block_trace(seed=0)
    for block_size in (4, 8):
        curve = miss_ratio_curve(trace_block_stream(requests, block_size), block_size)
        for num_blocks in (curve.min_num_blocks + 5, curve.min_num_blocks * 2, 1 << 20):
            replayed = replayed_hit_blocks(requests, block_size, num_blocks)
            assert abs(curve.hits_at(num_blocks) - replayed) <= 0.005 * curve.prompt_blocks


def test_run_stream_gives_the_trace_streams_curve(tmp_path: Path) -> None:
    rows = [
        {
            "request_id": request.request_id,
            "timestamp": request.timestamp_ms,
            "token_ids": list(request.token_ids or ()),
            "output_length": request.output_length,
            **({"lora": request.lora} if request.lora else {}),
        }
        for request in shared_prefix_trace(seed=5, num_requests=60)
    ]
    run = tiny_run(tmp_path, rows, block_size=8, num_blocks=300)
    with RunFile.open(run) as run_file:
        block_size, stream = run_block_stream(run_file)
    from_run = miss_ratio_curve(stream, block_size)
    from_trace = miss_ratio_curve(trace_block_stream(read_trace(tmp_path / "trace.jsonl"), 8), 8)
    assert block_size == 8
    assert from_run.hit_blocks.tolist() == from_trace.hit_blocks.tolist()
    assert from_run.prompt_blocks == from_trace.prompt_blocks
    assert from_run.min_num_blocks == from_trace.min_num_blocks


def test_shards_sampling_tracks_the_exact_curve(mooncake_trace: Path) -> None:
    stream = trace_block_stream(read_trace(mooncake_trace), 512)
    exact = miss_ratio_curve(stream, 512)
    sampled = miss_ratio_curve(stream, 512, sample_rate=0.3)
    for num_blocks in (1_000, 2_000, 5_000, 10_000, 20_000, 50_000):
        assert sampled.token_hit_ratio(num_blocks) == pytest.approx(
            exact.token_hit_ratio(num_blocks), abs=0.01
        )
    assert sampled.sample_rate == 0.3
    with pytest.raises(ValueError, match="sample rate"):
        miss_ratio_curve(stream, 512, sample_rate=0)


def test_mooncake_stream_uses_block_ids_without_expanding_tokens(mooncake_trace: Path) -> None:
    requests = read_trace(mooncake_trace)[:200]
    for block_size in (128, 512, 1024, 384):
        curve = miss_ratio_curve(trace_block_stream(requests, block_size), block_size)
        num_blocks = curve.min_num_blocks * 3
        assert curve.hits_at(num_blocks) == replayed_hit_blocks(requests, block_size, num_blocks)


# The published Mooncake sizes and more: the curve must agree with vLLM-manager replays
# (kvscope whatif, sequential) within 0.01 at each.
MOONCAKE_SIZES = (1_000, 2_000, 5_000, 10_000, 20_000, 40_000)


@pytest.mark.slow
def test_curve_agrees_with_vllm_replays_on_the_mooncake_trace(
    mooncake_trace: Path, tmp_path: Path
) -> None:
    curve = miss_ratio_curve(trace_block_stream(read_trace(mooncake_trace), 512), 512)
    points = [SweepPoint(512, num_blocks, 1) for num_blocks in MOONCAKE_SIZES]
    options = ReplayOptions(settings=CacheSettings(512, 1_000), timing="sequential")
    results = run_sweep(Source(mooncake_trace), points, tmp_path, options, secret=SECRET, jobs=2)
    assert [row.num_blocks for row in results] == list(MOONCAKE_SIZES)
    for row in results:
        assert curve.block_hit_ratio(row.num_blocks) == pytest.approx(row.block_hit_ratio, abs=0.01)
        assert curve.token_hit_ratio(row.num_blocks) == pytest.approx(row.token_hit_ratio, abs=0.01)
