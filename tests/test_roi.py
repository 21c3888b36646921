"""The ROI cost model (exact arithmetic) and the ROI queries on a small real run."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from collector.model import cost
from collector.queries import roi
from collector.queries.timeline import time_grid
from collector.store.run_file import RunFile
from tests.support.runs import shared_prefix_run, stored_hashes

MODEL = cost.CostModel()  # Llama-3.1-8B on an H100 SXM at 40 % MFU, $2.50/GPU-hour
WIDTH = 32 * 128  # attention heads x head size


@pytest.fixture
def run_file(tmp_path: Path) -> RunFile:
    return RunFile.open(shared_prefix_run(tmp_path))


def test_kv_bytes_per_block() -> None:
    # 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes = 128 KiB per token.
    assert MODEL.kv_bytes_per_block(16) == 2 * 1024 * 1024
    fp8 = cost.CostModel(kv_dtype_bytes=1, num_layers=80)
    assert fp8.kv_bytes_per_block(16) == 80 * 8 * 128 * 2 * 16


def test_prompt_flops() -> None:
    # 8 hit tokens: 2 x 8.03e9 x 8, plus attention 2 x 32 x 4096 x (64 + 8).
    assert MODEL.prompt_flops(8.0, 64.0) == pytest.approx(
        2 * 8.03e9 * 8 + 2 * 32 * WIDTH * 72, rel=1e-15
    )


def test_block_flops_add_up_to_the_prompt_flops() -> None:
    # One prompt hitting n blocks of b tokens at positions 0..n-1 saves exactly what its
    # n * b hit tokens save.
    for blocks, block_size in ((1, 16), (2, 4), (7, 16), (40, 32)):
        tokens = blocks * block_size
        position_hits = blocks * (blocks - 1) / 2
        assert MODEL.block_flops(float(blocks), position_hits, block_size) == pytest.approx(
            MODEL.prompt_flops(float(tokens), float(tokens) ** 2), rel=1e-12
        )


def test_gpu_seconds_and_money() -> None:
    flops = 989e12 * 0.4 * 3600  # one GPU-hour of work at 40 % MFU
    assert MODEL.gpu_seconds(flops) == pytest.approx(3600.0)
    assert MODEL.dollars(3600.0) == 2.5


def test_held_block_seconds(run_file: RunFile) -> None:
    grid = time_grid(run_file)
    # A1 and A2 30 ms, B3 20 ms (then evicted), C2 10 ms, S1 and S2 stored at the end.
    assert roi.held_block_seconds(run_file, grid.whole_run()) == pytest.approx(0.09)
    # In b0's bucket (50 us): A1, A2 and the new B3.
    assert roi.held_block_seconds(run_file, grid.buckets(200, 200)) == pytest.approx(150e-6)


def test_prefix_savings(run_file: RunFile) -> None:
    hashes = stored_hashes(run_file)
    families = roi.prefix_savings(run_file, time_grid(run_file).whole_run())
    # One family was hit (under A1): A1 twice at position 0, A2 once at position 1. The
    # salted family under S1 was never hit.
    records = families.to_dict("records")
    assert len(records) == 1
    assert records[0] | {"block_seconds": round(records[0]["block_seconds"], 9)} == {
        "root_hash": hashes["A1"],
        "block_hits": 3,
        "position_hits": 1,
        "block_seconds": 0.09,  # A1, A2, B3 and C2 are all under A1
        "tenant": "a",
        "lora": None,
        "first_stored_by": "a0",
    }
    # From 15 ms: a1's hit on A1; A1, A2 and B3 held 15 ms of it, C2 (stored at 20 ms) 10.
    late = roi.prefix_savings(run_file, time_grid(run_file).buckets(300, 600))
    assert late[["block_hits", "position_hits"]].to_dict("records") == [
        {"block_hits": 1, "position_hits": 0}
    ]
    assert late["block_seconds"].tolist() == pytest.approx([3 * 0.015 + 0.010])


def test_pricing() -> None:
    frame = pd.DataFrame({"hit_tokens": [8], "hit_tokens_squared": [64], "block_seconds": [3600.0]})
    priced = cost.price_prompts(frame, MODEL, block_size=4).iloc[0]
    flops = MODEL.prompt_flops(8.0, 64.0)
    assert priced["gpu_seconds_saved"] == pytest.approx(flops / (989e12 * 0.4))
    assert priced["dollars_saved"] == pytest.approx(flops / (989e12 * 0.4) / 3600 * 2.5)
    # One block-hour of 512 KiB blocks (block size 4).
    assert priced["gb_hours_held"] == pytest.approx(4 * 128 * 1024 / 1e9)
    # Over a window of 6 hours, a day is 4 such windows.
    daily = cost.per_day(cost.price_prompts(frame, MODEL, 4), 6 * 3600.0).iloc[0]
    assert daily["dollars_per_day"] == pytest.approx(4 * priced["dollars_saved"])
    assert daily["gpu_hours_per_day"] == pytest.approx(4 * priced["gpu_seconds_saved"] / 3600)
    blocks = pd.DataFrame({"block_hits": [2], "position_hits": [1], "block_seconds": [0.0]})
    assert cost.price_blocks(blocks, MODEL, 4).iloc[0]["gpu_seconds_saved"] == pytest.approx(
        priced["gpu_seconds_saved"]
    )


def test_roi_figures_and_over_time() -> None:
    # Two requests in an hour: prompts of 1,000 and 3,000 tokens, hits of 0 and 2,000.
    prompts = cost.PromptTotals(2, 4_000, 1_000**2 + 3_000**2, 2_000, 2_000**2)
    totals = cost.roi_figures(
        MODEL, prompts, block_seconds=7200.0, block_size=16, duration_s=3600.0
    )
    # By hand: 2 * 8.03e9 FLOPs per token, plus 2 * 32 layers * 4096 * h * (h + 1).
    per_second = 989e12 * 0.4

    def flops(tokens: int) -> float:
        return 2 * 8.03e9 * tokens + 2 * 32 * 4096 * tokens * (tokens + 1)

    uncached = (flops(1_000) + flops(3_000)) / per_second
    saved = flops(2_000) / per_second
    assert totals["prefill_ms_uncached"] == pytest.approx(1000 * uncached / 2)
    assert totals["prefill_ms_cached"] == pytest.approx(1000 * (uncached - saved) / 2)
    assert totals["gpu_seconds_saved"] == pytest.approx(saved)
    assert totals["gpu_hours_per_day"] == pytest.approx(saved * 24 / 3600)
    assert totals["dollars_per_day"] == pytest.approx(saved * 24 / 3600 * 2.5)
    assert totals["requests_per_hour"] == 2
    assert totals["mean_gb_held"] == pytest.approx(2 * 2 * 1024 * 1024 / 1e9)
    points = pd.DataFrame(
        {"t_s": [0.0, 1.0], "width_s": [1.0, 1.0], "hit_tokens": [0, 8],
         "hit_tokens_squared": [0, 64], "cached_blocks": [10, 20]}
    )  # fmt: skip
    series = cost.savings_over_time(points, MODEL, 16)
    assert series["gb_held"].tolist() == pytest.approx([10 * 2**21 / 1e9, 20 * 2**21 / 1e9])
    assert series["gpu_seconds_saved"].tolist()[0] == 0.0
    assert series["width_s"].tolist() == [1.0, 1.0]  # for the chart's "per 1 s" axis
    assert MODEL.compute_assumptions() == (
        "Llama-3.1-8B: 8.03 B parameters, 32 layers x 32 heads x 128; H100 SXM at 989 "
        "TFLOP/s peak, 40% MFU, $2.50 (USD) per GPU-hour"
    )
    assert MODEL.memory_assumptions(16) == (
        "2 MiB per block = 2 x 32 layers x 8 KV heads x 128 x 2 bytes x 16 tokens"
    )
