"""Tenant queries on small real runs: usage per tenant and adapter, and cross-tenant hits
(unsalted, salted apart, and sharing one salt)."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.queries import tenants
from collector.queries.timeline import time_grid
from collector.store.run_file import RunFile
from engine_hooks.privacy import Pseudonymizer
from tests.support.block_manager import tiny_run
from tests.support.repo import SECRET
from tests.support.runs import shared_prefix_run


def test_tenant_usage(tmp_path: Path) -> None:
    with RunFile.open(shared_prefix_run(tmp_path)) as run_file:
        window = time_grid(run_file).whole_run()
        usage = tenants.tenant_usage(run_file, window)
    duration = window.duration_s  # 601 buckets of 50 us
    records = usage.to_dict("records")
    for record in records:
        record["block_seconds"] = round(record["block_seconds"], 9)
        record["mean_blocks_held"] = round(record["mean_blocks_held"] * duration, 9)
    assert records == [
        # a0 and a1: 4 of 16 tokens hit; A1, A2, C2 held 30 + 30 + 10 ms.
        {"tenant": "a", "lora": "(none)", "requests": 2, "prompt_tokens": 16, "hit_tokens": 4,
         "hit_tokens_squared": 16, "hit_ratio": 0.25, "salted_requests": 0, "blocks_stored": 3,
         "block_seconds": 0.07, "mean_blocks_held": 0.07},
        {"tenant": "b", "lora": "(none)", "requests": 1, "prompt_tokens": 12, "hit_tokens": 8,
         "hit_tokens_squared": 64, "hit_ratio": 8 / 12, "salted_requests": 0,
         "blocks_stored": 1, "block_seconds": 0.02, "mean_blocks_held": 0.02},
        {"tenant": "c", "lora": "(none)", "requests": 1, "prompt_tokens": 8, "hit_tokens": 0,
         "hit_tokens_squared": 0, "hit_ratio": 0.0, "salted_requests": 1, "blocks_stored": 2,
         "block_seconds": 0.0, "mean_blocks_held": 0.0},
    ]  # fmt: skip


def test_cross_tenant_hits_unsalted(tmp_path: Path) -> None:
    with RunFile.open(shared_prefix_run(tmp_path)) as run_file:
        cross = tenants.cross_tenant_hits(run_file, time_grid(run_file).whole_run())
    assert cross.to_dict("records") == [
        {"stored_tenant": "a", "hit_tenant": "a", "block_hits": 1, "unsalted_hits": 1,
         "cross_tenant": False},
        # b was served two blocks a stored, unsalted: a timing side channel.
        {"stored_tenant": "a", "hit_tenant": "b", "block_hits": 2, "unsalted_hits": 2,
         "cross_tenant": True},
    ]  # fmt: skip


def _two_tenants(
    salt_x: str | None, salt_y: str | None, lora_y: str | None = None
) -> list[dict[str, object]]:
    """x then y send the same 8-token prompt (y hits at most its first block: vLLM always
    computes the prompt's last token)."""
    first: dict[str, object] = {"cache_salt": salt_x} if salt_x else {}
    second: dict[str, object] = {"cache_salt": salt_y} if salt_y else {}
    if lora_y:
        second["lora"] = lora_y
    prompt = list(range(1, 9))
    return [
        {"request_id": "x0", "timestamp": 0, "token_ids": prompt, "output_length": 0,
         "tenant": "x", **first},
        {"request_id": "y0", "timestamp": 10, "token_ids": prompt, "output_length": 0,
         "tenant": "y", **second},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("salt_x", "salt_y", "shared_hits", "unsalted_hits"),
    [(None, None, 1, 1), ("x-salt", "y-salt", 0, 0), ("shared", "shared", 1, 0)],
    ids=["unsalted", "salted-apart", "one-salt-for-both"],
)
def test_cross_tenant_hits_and_salts(
    tmp_path: Path,
    salt_x: str | None,
    salt_y: str | None,
    shared_hits: int,
    unsalted_hits: int,
) -> None:
    run = tiny_run(tmp_path, _two_tenants(salt_x, salt_y), num_blocks=10, reveal_tenants=True)
    with RunFile.open(run) as run_file:
        cross = tenants.cross_tenant_hits(run_file, time_grid(run_file).whole_run())
    assert int(cross.loc[cross["cross_tenant"], "block_hits"].sum()) == shared_hits
    # A shared salt is still a side channel, but not an unsalted one.
    assert int(cross["unsalted_hits"].sum()) == unsalted_hits


def test_adapters_do_not_share(tmp_path: Path) -> None:
    run = tiny_run(
        tmp_path, _two_tenants(None, None, lora_y="y-adapter"), num_blocks=10, reveal_tenants=True
    )
    with RunFile.open(run) as run_file:
        window = time_grid(run_file).whole_run()
        cross = tenants.cross_tenant_hits(run_file, window)
        usage = tenants.tenant_usage(run_file, window)
    assert cross.empty
    assert usage[["tenant", "lora", "hit_tokens", "blocks_stored"]].to_dict("records") == [
        {"tenant": "x", "lora": "(none)", "hit_tokens": 0, "blocks_stored": 2},
        {"tenant": "y", "lora": "y-adapter", "hit_tokens": 0, "blocks_stored": 2},
    ]


@pytest.mark.parametrize("reveal", [False, True], ids=["private", "revealed"])
def test_tenant_and_adapter_names_are_pseudonyms_unless_revealed(
    tmp_path: Path, reveal: bool
) -> None:
    rows = [
        {
            "timestamp": index,
            "token_ids": [1, 2, 3, 4, 5],
            "output_length": 1,
            "tenant": "acme",
            "lora": "acme-finetune" if index % 2 else None,
        }
        for index in range(4)
    ]
    run = tiny_run(tmp_path, rows, reveal_tenants=reveal, num_blocks=20)
    with RunFile.open(run) as run_file:
        labels = run_file.rows(
            "SELECT DISTINCT tenant, lora FROM requests ORDER BY lora NULLS FIRST"
        )
    names = Pseudonymizer(SECRET, reveal_tenants=reveal)
    assert labels == [
        (names.tenant("acme"), None),
        (names.tenant("acme"), names.lora("acme-finetune")),
    ]
    assert ("acme" in str(labels)) == reveal
