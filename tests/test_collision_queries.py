"""Collision queries: on a run file written through the store from real event records (a
collision cannot be provoked through vLLM's 256-bit hashes), and zero on a replay."""

from __future__ import annotations

from pathlib import Path

from collector.queries import collisions
from collector.queries.timeline import time_grid
from collector.store.run_file import RunConfig, RunFile, RunStore
from engine_hooks.events import Arrive, Collision, Hit, Lookup, Store, pack_counts
from tests.support.runs import shared_prefix_run

MS = 1_000_000
HASH = bytes(24) + (0xABCDEF).to_bytes(8, "big")


def collision_run(path: Path) -> Path:
    """b0 reuses block 7, which a0 stored under the same hash, but with other content."""
    store = RunStore.create(
        path,
        RunConfig(
            source="test",
            block_size=4,
            num_blocks=8,
            hash_algo="sha256",
            vllm_version="test",
            options={"check_collisions": True},
        ),
    )
    store.append(
        [
            Arrive(0, 0, "a0", 4, tenant="a"),
            Lookup(1, 0, "a0", 4, 0, 0, False),
            Store(2, 0, "a0", pack_counts([7]), HASH, None, 0, 4),
            Arrive(3, 5 * MS, "b0", 8, tenant="b"),
            Hit(4, 5 * MS, "b0", pack_counts([7]), HASH),
            Lookup(5, 5 * MS, "b0", 8, 4, 1, False),
            Collision(6, 5 * MS, "b0", 7, HASH, "a0", b"\x01\x02", b"\x03\x04"),
        ]
    )
    store.finalize()
    store.close()
    return path


def test_collision_rows_and_check(tmp_path: Path) -> None:
    with RunFile.open(collision_run(tmp_path / "run.duckdb")) as db:
        window = time_grid(db).whole_run()
        rows = collisions.collision_rows(db, window)
        check = collisions.collision_check(db, window)
    assert rows.to_dict("records") == [
        {
            "t_s": 0.005,
            "request_id": "b0",
            "request_tenant": "b",
            "stored_by": "a0",
            "stored_by_tenant": "a",
            "block_id": 7,
            "block_hash": "0000000000abcdef",
            "stored_fingerprint": "0102",
            "request_fingerprint": "0304",
            "engine_id": "",
            "dp_rank": 0,
        }
    ]
    assert check == {"checked": True, "collisions": 1, "hits_checked": 1, "hash_algo": "sha256"}


def test_no_collision_is_a_result(tmp_path: Path) -> None:
    with RunFile.open(shared_prefix_run(tmp_path)) as run_file:
        window = time_grid(run_file).whole_run()
        assert collisions.collision_rows(run_file, window).empty
        # b0 hit two blocks, a1 one: three hits checked.
        assert collisions.collision_check(run_file, window) == {
            "checked": True,
            "collisions": 0,
            "hits_checked": 3,
            "hash_algo": "sha256",
        }
