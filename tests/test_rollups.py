"""The rollup tables `finalize` builds, on a small real run, row by row; and on the sample
run, the rollups agree with the figures counted from raw events."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.queries import activity
from collector.queries.summary import run_summary
from collector.queries.timeline import time_grid
from collector.store.run_file import RunFile
from tests.support.repo import SAMPLE_RUN
from tests.support.runs import shared_prefix_run, stored_hashes

MS = 1_000_000


@pytest.fixture
def run_file(tmp_path: Path) -> RunFile:
    return RunFile.open(shared_prefix_run(tmp_path))


def rows(run_file: RunFile, sql: str) -> list[dict[str, object]]:
    return run_file.frame(sql).to_dict("records")


def test_time_grid(run_file: RunFile) -> None:
    # 30 ms / 1000 buckets wants 30 us; the next 1-2-5 step is 50 us. Five usable blocks:
    # one block per heatmap row.
    grid = time_grid(run_file)
    assert (grid.start_ns, grid.end_ns, grid.bucket_ns, grid.block_bin_size) == (
        0,
        30 * MS,
        50_000,
        1,
    )
    assert grid.last_bucket == 600


def test_time_rollup_rows(run_file: RunFile) -> None:
    table = rows(
        run_file,
        "SELECT bucket, requests, prompt_tokens, hit_tokens, prompt_blocks, hit_blocks, "
        "hit_tokens_squared, prompt_tokens_squared, block_hits, stores, evictions, "
        "preemptions, collisions, dropped_events, pool_rows, min_free FROM time_rollup "
        "ORDER BY bucket",
    )
    common = {"preemptions": 0, "collisions": 0, "dropped_events": 0, "pool_rows": 2}
    assert table == [
        {"bucket": 0, "requests": 1, "prompt_tokens": 8, "hit_tokens": 0, "prompt_blocks": 2,
         "hit_blocks": 0, "hit_tokens_squared": 0, "prompt_tokens_squared": 64,
         "block_hits": 0, "stores": 2, "evictions": 0, "min_free": 3, **common},
        # b0 hit a0's two blocks: 8 tokens, 8^2 = 64 for the attention term.
        {"bucket": 200, "requests": 1, "prompt_tokens": 12, "hit_tokens": 8,
         "prompt_blocks": 3, "hit_blocks": 2, "hit_tokens_squared": 64,
         "prompt_tokens_squared": 144, "block_hits": 2, "stores": 1, "evictions": 0,
         "min_free": 2, **common},
        {"bucket": 400, "requests": 1, "prompt_tokens": 8, "hit_tokens": 4, "prompt_blocks": 2,
         "hit_blocks": 1, "hit_tokens_squared": 16, "prompt_tokens_squared": 64,
         "block_hits": 1, "stores": 1, "evictions": 0, "min_free": 3, **common},
        {"bucket": 600, "requests": 1, "prompt_tokens": 8, "hit_tokens": 0, "prompt_blocks": 2,
         "hit_blocks": 0, "hit_tokens_squared": 0, "prompt_tokens_squared": 64,
         "block_hits": 0, "stores": 2, "evictions": 1, "min_free": 3, **common},
    ]  # fmt: skip


def test_block_heat_rows(run_file: RunFile) -> None:
    table = rows(run_file, "SELECT * FROM block_heat ORDER BY bucket, block_bin")
    cells = [(r["bucket"], r["block_bin"], r["hits"], r["stores"], r["evictions"]) for r in table]
    assert cells == [
        (0, 1, 0, 1, 0),
        (0, 2, 0, 1, 0),
        (200, 1, 1, 0, 0),
        (200, 2, 1, 0, 0),
        (200, 3, 0, 1, 0),
        (400, 1, 1, 0, 0),
        (400, 4, 0, 1, 0),
        (600, 3, 0, 1, 1),  # c0 evicted B3 from block 3 and stored S2 there
        (600, 5, 0, 1, 0),
    ]


def test_cache_lifetimes_rows(run_file: RunFile) -> None:
    names = {value: name for name, value in stored_hashes(run_file).items()}
    table = rows(
        run_file,
        "SELECT block_hash, block_id, stored_ns, ended_ns, ended_by, stored_by, tenant, "
        "salt_hash IS NOT NULL AS salted, root_hash FROM cache_lifetimes ORDER BY store_seq, "
        "block_position",
    )
    lifetimes = [
        (names[r["block_hash"]], r["block_id"], r["stored_ns"], r["ended_ns"],
         r["ended_by"] if isinstance(r["ended_by"], str) else None, r["stored_by"],
         r["tenant"], r["salted"], names[r["root_hash"]])
        for r in table
    ]  # fmt: skip
    assert lifetimes == [
        ("A1", 1, 0, 30 * MS, None, "a0", "a", False, "A1"),
        ("A2", 2, 0, 30 * MS, None, "a0", "a", False, "A1"),
        ("B3", 3, 10 * MS, 30 * MS, "evict", "b0", "b", False, "A1"),
        ("C2", 4, 20 * MS, 30 * MS, None, "a1", "a", False, "A1"),
        ("S1", 5, 30 * MS, 30 * MS, None, "c0", "c", True, "S1"),
        ("S2", 3, 30 * MS, 30 * MS, None, "c0", "c", True, "S1"),
    ]


def test_lifetime_hits_and_family_hits(run_file: RunFile) -> None:
    names = {value: name for name, value in stored_hashes(run_file).items()}
    lifetimes = run_file.rows("SELECT block_hash, hits FROM cache_lifetimes")
    assert {names[block]: hits for block, hits in lifetimes} == {
        "A1": 2, "A2": 1, "B3": 0, "C2": 0, "S1": 0, "S2": 0,
    }  # fmt: skip
    families = rows(run_file, "SELECT * FROM family_hits ORDER BY bucket")
    assert [(r["bucket"], names[r["root_hash"]], r["block_hits"], r["position_hits"])
            for r in families] == [(200, "A1", 2, 1), (400, "A1", 1, 0)]  # fmt: skip


def test_prefix_blocks_rows(run_file: RunFile) -> None:
    hashes = stored_hashes(run_file)
    names = {value: name for name, value in hashes.items()}
    table = rows(run_file, "SELECT * FROM prefix_blocks")
    blocks = {
        names[r["block_hash"]]: (
            None if r["parent_hash"] is None or r["parent_hash"] != r["parent_hash"]
            else names[r["parent_hash"]],
            r["block_position"], r["hits"], r["stores"], r["evictions"], r["first_use_ns"],
            r["last_use_ns"], r["tenant"], r["first_stored_by"], r["cached_ns"],
        )
        for r in table
    }  # fmt: skip
    assert blocks == {
        "A1": (None, 0, 2, 1, 0, 0, 20 * MS, "a", "a0", 30 * MS),
        "A2": ("A1", 1, 1, 1, 0, 0, 10 * MS, "a", "a0", 30 * MS),
        "B3": ("A2", 2, 0, 1, 1, 10 * MS, 10 * MS, "b", "b0", 20 * MS),
        "C2": ("A1", 1, 0, 1, 0, 20 * MS, 20 * MS, "a", "a1", 10 * MS),
        "S1": (None, 0, 0, 1, 0, 30 * MS, 30 * MS, "c", "c0", 0),
        "S2": ("S1", 1, 0, 1, 0, 30 * MS, 30 * MS, "c", "c0", 0),
    }
    # Sorted hottest first, so the top of the table is the top of the tree.
    assert [names[r["block_hash"]] for r in table[:2]] == ["A1", "A2"]


def test_tenant_sharing_rows(run_file: RunFile) -> None:
    table = rows(
        run_file,
        "SELECT bucket, stored_tenant, hit_tenant, stored_salt, block_hits FROM tenant_sharing",
    )
    assert table == [
        # b0 hit the two blocks a0 stored; a1 hit one of them.
        {"bucket": 200, "stored_tenant": "a", "hit_tenant": "b", "stored_salt": None,
         "block_hits": 2},
        {"bucket": 400, "stored_tenant": "a", "hit_tenant": "a", "stored_salt": None,
         "block_hits": 1},
    ]  # fmt: skip


def test_sample_rollups_match_the_raw_event_figures() -> None:
    with RunFile.open(SAMPLE_RUN) as run_file:
        summary = run_summary(run_file)
        figures = activity.window_figures(run_file, time_grid(run_file).whole_run())
    for name, value in figures.items():
        if name not in {"hit_tokens_squared", "prompt_tokens_squared"}:
            assert value == summary[name], name
