"""Collector queries on small real runs, with exact expected rows."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from collector import queries
from tests.helpers import tiny_run

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
def connection(tmp_path: Path) -> duckdb.DuckDBPyConnection:
    return duckdb.connect(str(tiny_run(tmp_path, ROWS)), read_only=True)


def test_eviction_regret_rows(connection: duckdb.DuckDBPyConnection) -> None:
    regret = queries.eviction_regret(connection)
    stored = dict(
        connection.execute(
            "SELECT block_position, block_hash FROM events "
            "WHERE kind = 'store' AND request_id = 'r0'"
        ).fetchall()
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
    assert queries.eviction_regret_summary(connection) == {
        "evictions": 4,
        "restored": 2,
        "regret_ratio": 0.5,
    }
    assert queries.eviction_regret_summary(connection, within_s=0.005)["restored"] == 0


def test_free_block_extremes(connection: duckdb.DuckDBPyConnection) -> None:
    # Each request holds two of the four usable blocks while it runs.
    assert queries.free_block_extremes(connection) == {
        "min_free_blocks": 2,
        "usable_blocks": 4,
        "low_free_step_share": 0.0,
    }


def test_tenant_hit_ratios(tmp_path: Path) -> None:
    rows = [
        {**ROWS[0], "tenant": "a"},
        {**ROWS[0], "request_id": "r1", "timestamp": 5, "tenant": "b", "lora": "x"},
    ]
    run = tiny_run(tmp_path, rows, reveal_tenants=True, num_blocks=20)
    with duckdb.connect(str(run), read_only=True) as connection:
        table = queries.tenant_hit_ratios(connection)
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
    from collector.time_window import time_grid
    from tests.runs import shared_prefix_run

    with duckdb.connect(str(shared_prefix_run(tmp_path)), read_only=True) as connection:
        # b0's bucket: two pool snapshots at 10 ms, after its prefill (2 of 5 blocks free)
        # and after it finished (all 5 free).
        window = time_grid(connection).buckets(200, 200)
        timeline = queries.pool_timeline(connection, window=window)
        low = queries.low_free_periods(connection, 0.5, window)
        extremes = queries.free_block_extremes(connection, 0.5, window)
        evictions = queries.event_times(connection, "evict", window=window)
        late_evictions = queries.event_times(
            connection, "evict", window=time_grid(connection).buckets(550, 600)
        )
    assert timeline.to_dict("records") == [
        {"t_s": 0.01, "free_uncached": 2, "cached_free": 0, "in_use": 3, "free": 2}
    ]
    assert low.to_dict("records") == [{"start_s": 0.01, "end_s": 0.01, "steps": 1}]
    assert extremes == {"min_free_blocks": 2, "usable_blocks": 5, "low_free_step_share": 0.5}
    assert evictions.empty
    # 27.5-30.05 ms in 400 buckets of 6,374 ns: the eviction at 30 ms is in the one that
    # starts 392 buckets in.
    assert late_evictions.to_dict("records") == [
        {"t_s": (27_500_000 + 392 * 6_374) / 1e9, "count": 1}
    ]
