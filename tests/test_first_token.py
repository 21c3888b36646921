"""Measured latency at the hooks: on vLLM's real Scheduler, each request's `FirstToken` comes
in the step whose output gave it its first token (as vLLM's own `EngineCoreOutputs` say), with
the prompt tokens the steps computed for it until then and its age since vLLM's arrival time;
a request that finishes on its first token records it before its `Finish`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine_hooks.buffer import EventBuffer
from engine_hooks.events import Arrive, Finish, FirstToken, Lookup, Preempt, Schedule
from engine_hooks.hooks import KVCacheHooks
from engine_hooks.privacy import Pseudonymizer
from engine_hooks.scheduler_hooks import SchedulerHooks
from engine_hooks.vllm_api import model_runner_output
from tests.support.engine import BLOCK_SIZE, make_scheduler, workload

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version

NS_PER_STEP = 1_000_000
WALL_OFFSET_NS = 1_700_000_000 * 10**9  # the front end's wall clock, ahead of the engine's


class StepClock:
    """The engine's clock in the test: the step number, in milliseconds."""

    def __init__(self) -> None:
        self.step = 0

    def engine_ns(self) -> int:
        return self.step * NS_PER_STEP

    def wall_ns(self) -> int:
        return WALL_OFFSET_NS + self.engine_ns()


def drive(model_dir: Path, num_blocks: int) -> dict[str, Any]:
    """The workload through vLLM's Scheduler, hooks attached, one token for each request whose
    prompt is computed (as a model runner samples); returns the records and what vLLM said:
    the step of each request's first token, and the tokens each step scheduled for it."""
    from vllm.sampling_params import SamplingParams  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.utils.hashing import get_hash_fn_by_name  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.v1.request import Request  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    scheduler = make_scheduler(
        model_dir, BLOCK_SIZE, num_blocks, max_num_seqs=16, max_num_batched_tokens=512
    )
    clock = StepClock()
    hooks = KVCacheHooks(
        scheduler.kv_cache_manager,
        EventBuffer(1 << 20),
        pseudonymizer=Pseudonymizer(b"first-token-test"),
        clock=clock.engine_ns,
    )
    SchedulerHooks(scheduler, hooks, lambda request: None, arrival_clock=clock.wall_ns).attach()
    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    block_hasher = get_request_block_hasher(BLOCK_SIZE, hash_fn)
    pending = workload()[:100]
    first_step: dict[str, int] = {}
    scheduled: dict[str, int] = {}
    arrival_s: dict[str, float] = {}
    while pending or scheduler.has_requests():
        clock.step += 1
        for index, row in enumerate(pending[:3]):
            # Every third request decodes no more than its first token.
            tokens = 1 if index == 0 else max(row["output_length"], 1)
            arrival_s[row["request_id"]] = (clock.wall_ns() - 3_000_000) / 1e9
            scheduler.add_request(
                Request(
                    row["request_id"],
                    row["token_ids"],
                    SamplingParams(max_tokens=tokens, ignore_eos=True),
                    None,
                    arrival_time=arrival_s[row["request_id"]],
                    block_hasher=block_hasher,
                )
            )
        del pending[:3]
        output = scheduler.schedule()
        request_ids = list(output.num_scheduled_tokens)
        sampled = []
        for request_id in request_ids:
            request = scheduler.requests[request_id]
            if request_id not in first_step:
                scheduled[request_id] = (
                    scheduled.get(request_id, 0) + (output.num_scheduled_tokens[request_id])
                )
            done = request.num_computed_tokens >= request.num_tokens
            sampled.append([7] if done else [])
        clock.step += 1  # the step's output comes later than its scheduling
        results = scheduler.update_from_output(
            output, model_runner_output(request_ids, sampled_token_ids=sampled)
        )
        for engine_outputs in results.values():
            for out in engine_outputs.outputs:
                if out.new_token_ids and out.request_id not in first_step:
                    first_step[out.request_id] = clock.step
    return {
        "records": hooks._buffer.take(),
        "first_step": first_step,
        "scheduled": scheduled,
        "arrival_s": arrival_s,
        "hooks": hooks,
    }


@pytest.mark.parametrize("num_blocks", [700, 120], ids=["roomy", "preempting"])
def test_each_first_token_is_timed_at_the_step_vllm_gave_it(
    tmp_path: Path, num_blocks: int
) -> None:
    result = drive(tmp_path / "model", num_blocks)
    records = result["records"]
    assert result["hooks"].failure is None
    first_tokens = {r.request_id: r for r in records if isinstance(r, FirstToken)}
    assert sum(isinstance(r, FirstToken) for r in records) == len(first_tokens), "once each"
    assert set(first_tokens) == set(result["first_step"]) and len(first_tokens) == 100
    for request_id, record in first_tokens.items():
        assert record.ts_ns == result["first_step"][request_id] * NS_PER_STEP
        assert record.num_tokens == result["scheduled"][request_id]
        arrival_ns = round(result["arrival_s"][request_id] * 1e9)
        assert record.age_ns == WALL_OFFSET_NS + record.ts_ns - arrival_ns
    # In record order: arrive, first schedule, first token, finish.
    order = {
        (type(r), r.request_id): index
        for index, r in reversed(list(enumerate(records)))
        if isinstance(r, (Arrive, Schedule, FirstToken, Finish))
    }
    for request_id in first_tokens:
        positions = [order[kind, request_id] for kind in (Arrive, Schedule, FirstToken, Finish)]
        assert positions == sorted(positions), request_id
    preempted = {r.request_id for r in records if isinstance(r, Preempt)}
    lookups = {r.request_id: r for r in records if isinstance(r, Lookup) and not r.preempted}
    computed_once = [
        request_id
        for request_id, record in first_tokens.items()
        if request_id not in preempted
        and record.num_tokens
        == lookups[request_id].num_prompt_tokens - lookups[request_id].num_hit_tokens
    ]
    unpreempted = [request_id for request_id in first_tokens if request_id not in preempted]
    assert computed_once == unpreempted, "without a preemption, the prompt less its hit"
    if num_blocks == 120:
        assert preempted, "the small pool preempts"
        recomputed = [r for r in preempted if r in first_tokens]
        assert all(first_tokens[r].num_tokens == result["scheduled"][r] for r in recomputed)
