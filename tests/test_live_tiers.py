"""Tier hits in a live engine: kvscope's hooks inside vLLM's real Scheduler with vLLM's own
CPU offloading (its OffloadingConnector, as `--kv-offloading-size` sets it up) record the
tokens the connector loads back, and kvscope's replay with a tier of the same size predicts
them request by request."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.store.run_file import RunFile
from engine_hooks import EventBuffer, KVCacheHooks, Pseudonymizer
from engine_hooks.events import Lookup
from tests.support.block_manager import tiny_run
from tests.support.engine import make_scheduler, workload
from tests.support.offloading import drive_with_tier

pytestmark = pytest.mark.vllm

BLOCK_SIZE = 16


def prompt(number: int) -> list[int]:
    """49 tokens: 3 full blocks of 16 and one token more."""
    return [number * 1_000 + token for token in range(1, 3 * BLOCK_SIZE + 2)]


# Six prompts in turn, six rounds: 18 full blocks, more than the GPU pool's 15 usable ones
# hold, so LRU never keeps a prompt until its turn comes again; a CPU tier of 128 blocks
# keeps them all.
PROMPTS = [prompt(number % 6) for number in range(36)]
EXPECTED = {f"r{index}": (0, 0 if index < 6 else 3 * BLOCK_SIZE) for index in range(36)}


def recorded_hits(buffer: EventBuffer) -> dict[str, tuple[int, int]]:
    """Each request's GPU hit and tier hit, in tokens, as the hooks' lookups recorded them."""
    return {
        record.request_id: (record.num_hit_tokens, record.num_tier_hit_tokens)
        for record in buffer.take()
        if isinstance(record, Lookup) and not record.preempted and record.request_id
    }


def replayed_hits(run: Path) -> dict[str, tuple[int, int]]:
    """The same, as a replay's run file holds them."""
    with RunFile.open(run) as store:
        rows = store.rows("SELECT request_id, num_hit_tokens, num_tier_hit_tokens FROM requests")
    return {request_id: (hits, tier) for request_id, hits, tier in rows}


def connector_hits(
    tmp_path: Path, prompts: list[list[int]], cpu_tier_blocks: int
) -> dict[str, tuple[int, int]]:
    """Each prompt's (GPU, tier) hits, one at a time through vLLM's Scheduler with its
    OffloadingConnector: 199 usable GPU blocks, a tier of `cpu_tier_blocks`."""
    scheduler = make_scheduler(
        tmp_path / "model", BLOCK_SIZE, 200, 1, cpu_tier_blocks=cpu_tier_blocks
    )
    buffer = EventBuffer()
    hooks = KVCacheHooks(scheduler.kv_cache_manager, buffer, pseudonymizer=Pseudonymizer(b"k"))
    hooks.attach()
    drive_with_tier(scheduler, prompts, output_length=2, one_at_a_time=True)
    return recorded_hits(buffer)


def test_the_hooks_record_what_vllms_offloading_connector_loads(tmp_path: Path) -> None:
    scheduler = make_scheduler(tmp_path / "model", BLOCK_SIZE, 16, 8, cpu_tier_blocks=128)
    buffer = EventBuffer()
    hooks = KVCacheHooks(scheduler.kv_cache_manager, buffer, pseudonymizer=Pseudonymizer(b"k"))
    hooks.attach()
    drive_with_tier(scheduler, PROMPTS, output_length=2)
    # No GPU hit ever; every request after the first round loads its 3 full blocks back.
    assert recorded_hits(buffer) == EXPECTED


def test_a_replay_with_a_tier_predicts_each_requests_tier_hits(tmp_path: Path) -> None:
    rows = [
        {"request_id": f"r{index}", "timestamp": index, "token_ids": tokens, "output_length": 2}
        for index, tokens in enumerate(PROMPTS)
    ]
    run = tiny_run(tmp_path, rows, block_size=BLOCK_SIZE, num_blocks=16, cpu_tier_blocks=128)
    assert replayed_hits(run) == EXPECTED


def test_the_replay_agrees_with_vllms_connector_on_a_mixed_workload(tmp_path: Path) -> None:
    # 200 requests of the generated workload (system prompts, RAG documents, chats, reports),
    # one at a time, 199 usable GPU blocks, a tier that never has to drop a block: every
    # request's GPU hit and tier hit are the engine's.
    prompts = [row["token_ids"] for row in workload()[:200]]
    live = connector_hits(tmp_path, prompts, 2_000)
    rows = [
        {"request_id": f"r{index}", "timestamp": index, "token_ids": tokens, "output_length": 2}
        for index, tokens in enumerate(prompts)
    ]
    run = tiny_run(tmp_path, rows, block_size=BLOCK_SIZE, num_blocks=200, cpu_tier_blocks=2_000)
    assert replayed_hits(run) == live
    assert sum(tier for _, tier in live.values()) > 0


@pytest.mark.parametrize("cpu_tier_blocks", [2_000, 400])
def test_a_scheduler_replay_with_a_tier_is_vllms_connector_request_by_request(
    tmp_path: Path, cpu_tier_blocks: int
) -> None:
    # `--timing scheduler` runs the tier through vLLM's own OffloadingConnector, so it agrees
    # with it on every request, also with a tier that must drop blocks (400), where the
    # sequential replay's one-pass model of the connector misses 2 of 200.
    prompts = [row["token_ids"] for row in workload()[:200]]
    live = connector_hits(tmp_path, prompts, cpu_tier_blocks)
    rows = [
        {
            "request_id": f"r{index}",
            "timestamp": index * 10_000,  # ms apart: one request at a time
            "token_ids": tokens,
            "output_length": 2,
        }
        for index, tokens in enumerate(prompts)
    ]
    run = tiny_run(
        tmp_path,
        rows,
        block_size=BLOCK_SIZE,
        num_blocks=200,
        timing="scheduler",
        max_num_seqs=1,
        cpu_tier_blocks=cpu_tier_blocks,
    )
    assert replayed_hits(run) == live
    assert sum(tier for _, tier in live.values()) > 0
