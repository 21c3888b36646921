"""vLLM's real Scheduler with its native CPU offloading (the OffloadingConnector's scheduler
side), driven with fake model outputs and a fake worker that finishes every transfer job in
the step after the scheduler planned it (the copies need a GPU; what is cached where does
not)."""

from __future__ import annotations

import time
from typing import Any

from engine_hooks.vllm_api import model_runner_output


def drive_with_tier(
    scheduler: Any, prompts: list[list[int]], output_length: int, one_at_a_time: bool = False
) -> int:
    """Add one request per step (with `one_at_a_time`, only once the last has finished),
    run every step with the worker's transfer reports, until all finish; returns the steps
    taken."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
        OffloadingWorkerMetadata,
    )
    from vllm.sampling_params import SamplingParams  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.utils.hashing import get_hash_fn_by_name  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.v1.outputs import KVConnectorOutput  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.v1.request import Request  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    block_hasher = get_request_block_hasher(scheduler.block_size, hash_fn)
    # The jobs the connector planned, by id: what the fake worker reports done.
    jobs = scheduler.connector.connector_scheduler._jobs
    pending = list(enumerate(prompts))
    steps = 0
    while pending or scheduler.has_requests():
        if pending and not (one_at_a_time and scheduler.has_requests()):
            index, prompt = pending.pop(0)
            params = SamplingParams(max_tokens=output_length, ignore_eos=True)
            request = Request(
                f"r{index}",
                prompt,
                params,
                None,
                arrival_time=time.time(),
                block_hasher=block_hasher,
            )
            scheduler.add_request(request)
        output = scheduler.schedule()
        plan = output.kv_connector_metadata
        done = {job_id: 1 for job_id in [*plan.load_jobs, *plan.store_jobs]}
        loaded = {jobs[job_id].req_id for job_id in plan.load_jobs}
        request_ids = [new.req_id for new in output.scheduled_new_reqs]
        request_ids += list(output.scheduled_cached_reqs.req_ids)
        model_output = model_runner_output(
            request_ids,
            sampled_token_ids=[[7] for _ in request_ids],
            kv_connector_output=KVConnectorOutput(
                finished_recving=loaded or None,
                kv_connector_worker_meta=OffloadingWorkerMetadata(completed_jobs=done),
            ),
        )
        scheduler.update_from_output(output, model_output)
        steps += 1
    return steps
