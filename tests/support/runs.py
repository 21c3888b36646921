"""Small handcrafted runs for the query, chart and page tests, replayed through vLLM's real
KV cache manager (tests/support/block_manager.tiny_run), and how to name their blocks.

SHARED_PREFIX (block size 4, six blocks: five usable; sequential timing, so each request's
events carry its trace time):
  a0  t=0 ms   tenant a   tokens 1-8          stores A1 (block 1), A2 (block 2, parent A1)
  b0  t=10 ms  tenant b   tokens 1-12         hits A1, A2 (a's blocks: cross-tenant); stores
                                              B3 (block 3, parent A2)
  a1  t=20 ms  tenant a   tokens 1-4, 21-24   hits A1; stores C2 (block 4, parent A1)
  c0  t=30 ms  tenant c   tokens 1-8, salted  salted hashes: stores S1 (block 5) and S2 in
                                              block 3, evicting B3 (the LRU free block)
The run spans 30 ms: the rollup grid has 50 us buckets, and the four requests fall in
buckets 0, 200, 400 and 600.

EVICTIONS (block size 4, six blocks: five usable, in vLLM's free queue as 1-5; sequential
timing; families X, Y and Z under their first blocks X1, Y1 and Z1):
  x0  t=0 ms   tenant x   tokens 1-8      stores X1, X2 in blocks 1, 2; frees them: the
                                          queue is 3 4 5 2 1 (a request's tail goes first)
  y0  t=10 ms  tenant y   tokens 101-112  stores Y1-Y3 in blocks 3-5; queue 2 1 5 4 3
  z0  t=20 ms  tenant y   tokens 201-212  takes blocks 2, 1, 5: evicts X2, X1 and Y3
  x1  t=30 ms  tenant x   tokens 1-8      X was evicted: takes blocks 4, 3, evicting Y2 and
                                          Y1, and stores X1, X2 again (10 ms after z0
                                          evicted them: both needed again)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collector.store.run_file import RunFile
from tests.support.block_manager import tiny_run

SHARED_PREFIX: list[dict[str, Any]] = [
    {"request_id": "a0", "timestamp": 0, "token_ids": list(range(1, 9)), "output_length": 0},
    {"request_id": "b0", "timestamp": 10, "token_ids": list(range(1, 13)), "output_length": 0},
    {
        "request_id": "a1",
        "timestamp": 20,
        "token_ids": [1, 2, 3, 4, 21, 22, 23, 24],
        "output_length": 0,
    },
    {
        "request_id": "c0",
        "timestamp": 30,
        "token_ids": list(range(1, 9)),
        "output_length": 0,
        "cache_salt": "s",
    },
]
_TENANTS = {"a0": "a", "b0": "b", "a1": "a", "c0": "c"}


def shared_prefix_run(directory: Path) -> Path:
    """The SHARED_PREFIX run, tenants revealed, token ids recorded, hits checked for
    collisions."""
    rows = [{**row, "tenant": _TENANTS[row["request_id"]]} for row in SHARED_PREFIX]
    directory.mkdir(parents=True, exist_ok=True)
    return tiny_run(
        directory,
        rows,
        block_size=4,
        num_blocks=6,
        reveal_tenants=True,
        record_token_ids=True,
        check_collisions=True,
    )


def stored_hashes(run_file: RunFile) -> dict[str, int]:
    """Block hashes by the names in the module docstring (vLLM seeds its hashes per process,
    so tests read them from the run)."""
    names = {
        ("a0", 0): "A1",
        ("a0", 1): "A2",
        ("b0", 2): "B3",
        ("a1", 1): "C2",
        ("c0", 0): "S1",
        ("c0", 1): "S2",
    }
    rows = run_file.rows(
        "SELECT request_id, block_position, block_hash FROM events WHERE kind = 'store'"
    )
    return {names[(request, position)]: int(block_hash) for request, position, block_hash in rows}


def hex_names(run_file: RunFile) -> dict[str, str]:
    """The same blocks as 16 hex digits (how pages name them)."""
    return {name: f"{value:016x}" for name, value in stored_hashes(run_file).items()}


EVICTIONS: list[dict[str, Any]] = [
    {"request_id": "x0", "timestamp": 0, "token_ids": list(range(1, 9)), "tenant": "x"},
    {"request_id": "y0", "timestamp": 10, "token_ids": list(range(101, 113)), "tenant": "y"},
    {"request_id": "z0", "timestamp": 20, "token_ids": list(range(201, 213)), "tenant": "y"},
    {"request_id": "x1", "timestamp": 30, "token_ids": list(range(1, 9)), "tenant": "x"},
]


def evictions_run(directory: Path) -> Path:
    """The EVICTIONS run, tenants revealed."""
    rows = [{**row, "output_length": 0} for row in EVICTIONS]
    directory.mkdir(parents=True, exist_ok=True)
    return tiny_run(directory, rows, block_size=4, num_blocks=6, reveal_tenants=True)


def family_roots(run_file: RunFile) -> dict[str, int]:
    """The EVICTIONS run's families by name: the hash of each one's first block."""
    rows = run_file.rows(
        "SELECT request_id, block_hash FROM events WHERE kind = 'store' AND block_position = 0"
    )
    names = {"x0": "X", "y0": "Y", "z0": "Z"}
    return {names[request]: int(block_hash) for request, block_hash in rows if request in names}
