"""Collector queries on small real runs, with exact expected rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.queries.pool import (
    eviction_regret,
    eviction_regret_summary,
    free_block_extremes,
    low_free_periods,
    pool_timeline,
)
from collector.queries.tenants import tenant_hit_ratios
from collector.queries.timeline import event_times, time_grid
from collector.store.run_file import RunFile
from tests.support.block_manager import tiny_run
from tests.support.runs import shared_prefix_run

# Block size 4, five blocks (four usable). r0 and r1 fill the pool; r2 evicts r0's two
# blocks (tail first); r3 repeats r0's prompt, evicting r1's blocks and storing r0's again:
# four evictions, two of them regretted.
ROWS = [
    {"request_id": "r0", "timestamp": 0, "token_ids": list(range(1, 9)), "output_length": 0},
    {"request_id": "r1", "timestamp": 10, "token_ids": list(range(11, 19)), "output_length": 0},
    {"request_id": "r2", "timestamp": 20, "token_ids": list(range(21, 29)), "output_length": 0},
    {"request_id": "r3", "timestamp": 30, "token_ids": list(range(1, 9)), "output_length": 0},
]


@pytest.fixture
def run_file(tmp_path: Path) -> RunFile:
    return RunFile.open(tiny_run(tmp_path, ROWS))


def test_eviction_regret_rows(run_file: RunFile) -> None:
    regret = eviction_regret(run_file)
    stored = dict(
        run_file.rows(
            "SELECT block_position, block_hash FROM events "
            "WHERE kind = 'store' AND request_id = 'r0'"
        )
    )
    rows = regret[["block_id", "block_hash", "ts_ns", "age_ns", "num_hits", "restored_after_ns"]]
    assert len(rows) == 4
    assert rows["restored_after_ns"].isna().tolist() == [False, False, True, True]
    assert rows.head(2).to_dict("records") == [
        # r0's blocks went back to the free queue tail first (block 2 = its second block).
        {
            "block_id": 2,
            "block_hash": stored[1],
            "ts_ns": 20_000_000,
            "age_ns": 20_000_000,
            "num_hits": 0,
            "restored_after_ns": 10_000_000,
        },
        {
            "block_id": 1,
            "block_hash": stored[0],
            "ts_ns": 20_000_000,
            "age_ns": 20_000_000,
            "num_hits": 0,
            "restored_after_ns": 10_000_000,
        },
    ]
    assert eviction_regret_summary(run_file) == {
        "evictions": 4,
        "restored": 2,
        "regret_ratio": 0.5,
    }
    assert eviction_regret_summary(run_file, within_s=0.005)["restored"] == 0


def test_free_block_extremes(run_file: RunFile) -> None:
    # Each request holds two of the four usable blocks while it runs.
    assert free_block_extremes(run_file) == {
        "min_free_blocks": 2,
        "usable_blocks": 4,
        "low_free_step_share": 0.0,
        "low_free_s": 0.0,
        "low_free_time_share": 0.0,
    }


def test_tenant_hit_ratios(tmp_path: Path) -> None:
    rows = [
        {**ROWS[0], "tenant": "a"},
        {**ROWS[0], "request_id": "r1", "timestamp": 5, "tenant": "b", "lora": "x"},
    ]
    run = tiny_run(tmp_path, rows, reveal_tenants=True, num_blocks=20)
    with RunFile.open(run) as run_file:
        table = tenant_hit_ratios(run_file)
    assert table.to_dict("records") == [
        {
            "tenant": "a",
            "lora": "(none)",
            "requests": 1,
            "prompt_tokens": 8.0,
            "hit_tokens": 0.0,
            "hit_ratio": 0.0,
        },
        # LoRA requests hash differently: b's identical prompt finds nothing of a's.
        {
            "tenant": "b",
            "lora": "x",
            "requests": 1,
            "prompt_tokens": 8.0,
            "hit_tokens": 0.0,
            "hit_ratio": 0.0,
        },
    ]


def test_free_block_queries_in_a_window(tmp_path: Path) -> None:
    with RunFile.open(shared_prefix_run(tmp_path)) as run_file:
        # b0's bucket: two pool snapshots at 10 ms, after its prefill (2 of 5 blocks free)
        # and after it finished (all 5 free).
        window = time_grid(run_file).buckets(200, 200)
        timeline = pool_timeline(run_file, window=window)
        low = low_free_periods(run_file, 0.5, window)
        extremes = free_block_extremes(run_file, 0.5, window)
        evictions = event_times(run_file, "evict", window=window)
        late_evictions = event_times(
            run_file, "evict", window=time_grid(run_file).buckets(550, 600)
        )
    assert timeline.to_dict("records") == [
        {"t_s": 0.01, "free_uncached": 2, "cached_free": 0, "in_use": 3, "free": 2}
    ]
    assert low.to_dict("records") == [{"start_s": 0.01, "end_s": 0.01, "steps": 1}]
    assert extremes == {
        "min_free_blocks": 2,
        "usable_blocks": 5,
        "low_free_step_share": 0.5,
        "low_free_s": 0.0,  # both steps at 10 ms: the low one held for no time
        "low_free_time_share": 0.0,
    }
    assert evictions.empty
    # 27.5-30.05 ms in 400 buckets of 6,374 ns: the eviction at 30 ms is in the one that
    # starts 392 buckets in.
    assert late_evictions.to_dict("records") == [
        {"t_s": (27_500_000 + 392 * 6_374) / 1e9, "count": 1}
    ]


def test_time_under_the_alarm_is_the_low_stretches_held(tmp_path: Path) -> None:
    # A request a second; each decodes 4 tokens one step at a time, holding three of the
    # four usable blocks (under 60 % free) from its prefill to its last step.
    rows = [
        {**row, "timestamp": 1000 * index, "output_length": 4} for index, row in enumerate(ROWS)
    ]
    run = tiny_run(tmp_path, rows, timing="timestamps", max_num_seqs=1)
    with RunFile.open(run) as run_file:
        extremes = free_block_extremes(run_file, 0.6)
        periods = low_free_periods(run_file, 0.6)
        span_s = run_file.row("SELECT (max(ts_ns) - min(ts_ns)) / 1e9 FROM pool")[0]
    # Four stretches of 40.2 ms (the step model's prefill and three decode steps), one a
    # second, in the 3.0402 s from the first pool step to the last.
    assert periods["start_s"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert (periods["end_s"] - periods["start_s"]).tolist() == pytest.approx([0.0402] * 4)
    assert span_s == pytest.approx(3.0402)
    assert extremes["low_free_s"] == pytest.approx(4 * 0.0402)
    assert extremes["low_free_time_share"] == pytest.approx(4 * 0.0402 / 3.0402)
