"""The hooks never raise into vLLM: a failure inside any hook's own code is caught at the
hook's edge, counted, logged once, and stops capture of that engine (every hook detached,
the run told why), while vLLM's call goes on as if no hook were there.

Each test injects a failure into one hook's own code on vLLM's real Scheduler and checks that
everything vLLM does (what each step schedules, the blocks it gives, preemptions, prefix-cache
stats, what is left cached) equals a run without hooks, step for step."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine_hooks.buffer import EventBuffer
from engine_hooks.hooks import KVCacheHooks
from engine_hooks.privacy import Pseudonymizer
from engine_hooks.scheduler_hooks import SchedulerHooks
from engine_hooks.vllm_api import model_runner_output
from tests.support.engine import (
    BLOCK_SIZE,
    collector_process,
    make_scheduler,
    stop_collector,
    workload,
)
from tests.support.repo import REPO

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version

NUM_BLOCKS = 300  # small: the workload evicts and preempts
MAX_NUM_SEQS = 16

# Each hook, and the piece of its own code (on the manager's hooks, or the scheduler's) that
# the test makes raise.
MANAGER_HOOKS = {
    "BlockPool.get_new_blocks": "_record_allocate",
    "BlockPool.touch": "_record_hit",
    "BlockPool.cache_full_blocks": "_record_stores",
    "BlockPool.free_blocks": "_record_free",
    "BlockPool.evict_blocks": "_record_evictions",
    "BlockPool.reset_prefix_cache": "_record_reset",
    "KVCacheManager.record_prefix_cache_stats": "_record_lookup",
    "Scheduler.add_request": "on_arrive",
    "Scheduler._preempt_request": "on_preempt",
    "Scheduler._free_request": "on_finish",
}
SCHEDULER_HOOKS = {
    "Scheduler.schedule": "_record_scheduled",
    "Scheduler.update_from_output": "_record_first_tokens",
}
# Reached before vLLM's call: vLLM's call must still run.
BEFORE_HOOKS = {"BlockPool.evict_blocks": "_cached_keys"}
SCHEDULER_BEFORE_HOOKS = {"Scheduler.update_from_output": "_count_prefill"}


def run(model_dir: Path, inject: tuple[str, str, str] | None, hooks_on: bool) -> dict[str, Any]:
    """Drive the workload through vLLM's Scheduler; then evict some cached blocks and reset
    the cache. Returns all that vLLM did, and the hooks (or None)."""
    from vllm.sampling_params import SamplingParams  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.utils.hashing import get_hash_fn_by_name  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.v1.request import Request  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    scheduler = make_scheduler(model_dir, BLOCK_SIZE, NUM_BLOCKS, MAX_NUM_SEQS)
    manager = scheduler.kv_cache_manager
    hooks = None
    scheduler_hooks = None
    stopped: list[str] = []
    if hooks_on:
        hooks = KVCacheHooks(
            manager,
            EventBuffer(1 << 20),
            pseudonymizer=Pseudonymizer(b"never-raise-test"),
            check_collisions=True,
            record_token_ids=True,
        )
        scheduler_hooks = SchedulerHooks(scheduler, hooks, lambda request: "tenant")
        scheduler_hooks.on_failure = stopped.append
        scheduler_hooks.attach()
        if inject is not None:
            owner_name, method, _ = inject
            owner = scheduler_hooks if owner_name == "scheduler" else hooks

            def fail(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeError(f"injected into {method}")

            setattr(owner, method, fail)

    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    block_hasher = get_request_block_hasher(BLOCK_SIZE, hash_fn)
    pending = workload()[:120]
    steps: list[Any] = []
    stats = [0, 0]
    while pending or scheduler.has_requests():
        for row in pending[:4]:
            scheduler.add_request(
                Request(
                    row["request_id"],
                    row["token_ids"],
                    SamplingParams(max_tokens=max(row["output_length"], 1), ignore_eos=True),
                    None,
                    arrival_time=0.0,
                    block_hasher=block_hasher,
                )
            )
        del pending[:4]
        output = scheduler.schedule()
        steps.append(
            (
                sorted(output.num_scheduled_tokens.items()),
                sorted((new.req_id, new.block_ids) for new in output.scheduled_new_reqs),
                sorted(output.finished_req_ids),
                manager.block_pool.get_num_free_blocks(),
            )
        )
        request_ids = list(output.num_scheduled_tokens)
        result = scheduler.update_from_output(
            output,
            model_runner_output(
                request_ids, sampled_token_ids=[[1000 + len(steps) % 7] for _ in request_ids]
            ),
        )
        for engine_outputs in result.values():
            scheduler_stats = engine_outputs.scheduler_stats
            prefix = scheduler_stats.prefix_cache_stats if scheduler_stats else None
            if prefix:
                stats[0] += prefix.queries
                stats[1] += prefix.hits
    pool = manager.block_pool
    cached = sorted(block.block_id for block in pool.blocks if block.block_hash is not None)
    pool.evict_blocks(set(cached[:20]))
    after_evict = sorted(block.block_id for block in pool.blocks if block.block_hash is not None)
    reset = manager.reset_prefix_cache()
    return {
        "steps": steps,
        "stats": stats,
        "cached": cached,
        "after_evict": after_evict,
        "reset": reset,
        "after_reset": sum(block.block_hash is not None for block in pool.blocks),
        "hooks": hooks,
        "scheduler_hooks": scheduler_hooks,
        "scheduler": scheduler,
        "stopped": stopped,
    }


VLLM_FACTS = ("steps", "stats", "cached", "after_evict", "reset", "after_reset")


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run(tmp_path_factory.mktemp("model"), None, hooks_on=False)


def test_the_workload_reaches_every_hook(bare: dict[str, Any], tmp_path: Path) -> None:
    hooked = run(tmp_path / "model", None, hooks_on=True)
    assert {fact: hooked[fact] for fact in VLLM_FACTS} == {fact: bare[fact] for fact in VLLM_FACTS}
    hooks = hooked["hooks"]
    assert hooks.failure is None and hooks.num_failures == 0 and hooks.attached
    kinds = {type(record).__name__ for record in hooks._buffer.take()}
    assert kinds >= {"Arrive", "Lookup", "Hit", "Allocate", "Store", "Free", "Evict", "Reset"}
    assert kinds >= {"Schedule", "Preempt", "FirstToken", "Finish", "Pool"}
    assert len(bare["cached"]) > 20 and bare["reset"]


@pytest.mark.parametrize(
    ("hook", "owner", "method"),
    [(hook, "hooks", method) for hook, method in MANAGER_HOOKS.items()]
    + [(hook, "scheduler", method) for hook, method in SCHEDULER_HOOKS.items()]
    + [(hook, "hooks", method) for hook, method in BEFORE_HOOKS.items()]
    + [(hook, "scheduler", method) for hook, method in SCHEDULER_BEFORE_HOOKS.items()],
)
def test_a_failure_in_a_hook_leaves_vllm_untouched_and_stops_capture(  # noqa: PLR0917
    bare: dict[str, Any],
    tmp_path: Path,
    hook: str,
    owner: str,
    method: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="vllm.kvscope"):
        hooked = run(tmp_path / "model", (owner, method, hook), hooks_on=True)
    assert {fact: hooked[fact] for fact in VLLM_FACTS} == {fact: bare[fact] for fact in VLLM_FACTS}
    hooks = hooked["hooks"]
    assert hooks.failure == f"{hook}: RuntimeError: injected into {method}"
    assert hooks.num_failures == 1, "detached at the first: no hook runs after"
    assert not hooks.attached and not hooked["scheduler_hooks"].attached
    scheduler = hooked["scheduler"]
    pool = scheduler.kv_cache_manager.block_pool
    # vLLM's own bound methods again, on the scheduler and on the pool
    assert scheduler.schedule.__self__ is scheduler and pool.touch.__self__ is pool
    assert hooked["stopped"] == [hooks.failure], "the plugin hears why, once"
    lines = [line for line in caplog.records if "capture of this engine stopped" in line.message]
    assert len(lines) == 1 and hook in lines[0].message


def test_a_capture_whose_hook_fails_records_why_in_the_run(
    tmp_path: Path, capture_environment: str
) -> None:
    """Through the plugin, a real collector and the run file: the run says capture stopped."""
    run_path = tmp_path / "run.duckdb"
    with collector_process(run_path, capture_environment) as process:
        scheduler = make_scheduler(tmp_path / "model", BLOCK_SIZE, NUM_BLOCKS, MAX_NUM_SEQS)
        capture = scheduler.kvscope_capture

        def fail(*args: Any) -> None:
            raise ValueError("injected")

        capture.hooks._record_hit = fail
        from vllm.sampling_params import SamplingParams  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
        from vllm.utils.hashing import get_hash_fn_by_name  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
        from vllm.v1.request import Request  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

        hash_fn = get_hash_fn_by_name("sha256")
        init_none_hash(hash_fn)
        hasher = get_request_block_hasher(BLOCK_SIZE, hash_fn)
        prompt = list(range(1, 4 * BLOCK_SIZE + 1))
        for number in range(3):  # the second request hits the first's blocks
            request = Request(
                f"r{number}", prompt, SamplingParams(max_tokens=2), None, 0.0, block_hasher=hasher
            )
            scheduler.add_request(request)
            while scheduler.has_requests():
                output = scheduler.schedule()
                ids = list(output.num_scheduled_tokens)
                scheduler.update_from_output(
                    output, model_runner_output(ids, sampled_token_ids=[[7] for _ in ids])
                )
        assert capture.hooks.failure == "BlockPool.touch: ValueError: injected"
        transport = capture.transport
        scheduler.shutdown()
        delivery = (
            f"{transport.num_sent} records sent, {transport.num_delivered} records delivered, "
            f"{transport.num_dropped} dropped, connected: {transport.connected}"
        )
        collector_output = stop_collector(process)
    summary = subprocess.run(
        [sys.executable, "-m", "collector.cli", "summary", str(run_path), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert summary.returncode == 0, f"{summary.stderr}\n{delivery}\n{collector_output}"
    figures = json.loads(summary.stdout)
    engine = capture.config.engine_id
    assert figures["capture_stopped"] == f"{engine} dp0: BlockPool.touch: ValueError: injected"
    assert figures["requests"] == 1, "the first request's records, then nothing"
