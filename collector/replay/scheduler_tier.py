"""A CPU tier in a replay through vLLM's Scheduler (scheduler_replay.py): vLLM's own
OffloadingConnector, as `--kv-offloading-size` sets it up, plans the loads and stores; the
worker side's copies need a GPU, so a stand-in reports every planned transfer done at the end
of the step that planned it, and a stand-in publisher keeps the tier's KV events."""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from collector.replay.simulator import VirtualClock
from collector.replay.tier_events import TierEvents
from collector.vllm_kv.wire import decode_batch

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig


@dataclass(frozen=True)
class TierSettings:
    """A CPU tier of `num_blocks` GPU-block-sized chunks under vLLM's `policy`."""

    num_blocks: int
    policy: str = "lru"


def offloading_config(config: KVCacheConfig, tier: TierSettings) -> KVTransferConfig:
    """The OffloadingConnector as `--kv-offloading-size` configures it, sized to hold
    `tier.num_blocks` of the replay's blocks (vLLM rounds each chunk up to whole memory pages,
    and the replay's tiny blocks are smaller than one)."""
    from vllm.config import KVTransferConfig  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    (group,) = config.kv_cache_groups
    page_bytes = -(-group.kv_cache_spec.page_size_bytes // mmap.PAGESIZE) * mmap.PAGESIZE
    return KVTransferConfig(
        kv_connector="OffloadingConnector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "cpu_bytes_to_use": tier.num_blocks * page_bytes,
            "eviction_policy": tier.policy,
        },
    )


def transfers_planned(output: SchedulerOutput) -> bool:
    """Whether the offloading connector planned loads or stores in the step: a step that
    only loads a request's blocks back schedules no token, and is no sign of a full pool."""
    plan: Any = output.kv_connector_metadata
    return bool(plan.load_jobs or plan.store_jobs)


def transfers_done(output: SchedulerOutput) -> Any:
    """What the offloading worker reports at the end of a step: every transfer the connector
    planned for it done, and the requests whose loads those were ready to run."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
        OffloadingWorkerMetadata,
    )
    from vllm.v1.outputs import KVConnectorOutput  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    plan: Any = output.kv_connector_metadata  # the OffloadingConnector's metadata
    jobs = {**plan.load_jobs, **plan.store_jobs}
    loaded = {job.req_id for job in plan.load_jobs.values()}
    return KVConnectorOutput(
        finished_recving=loaded or None,
        kv_connector_worker_meta=OffloadingWorkerMetadata(completed_jobs=dict.fromkeys(jobs, 1)),
    )


class TierPublisher:
    """Stands in for the scheduler's KV event publisher: keeps the tier's events (medium
    "CPU"), read as a collector reads them off the wire, at the replay's clock."""

    def __init__(self, tier_events: TierEvents, clock: VirtualClock) -> None:
        self._tier_events = tier_events
        self._clock = clock

    def publish(self, batch: Any) -> None:
        from vllm.distributed.kv_events import KVEventBatch  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

        tier = [event for event in batch.events if getattr(event, "medium", None) == "CPU"]
        if tier:
            payload = msgspec.msgpack.encode(KVEventBatch(ts=batch.ts, events=tier))
            self._tier_events.append(self._clock(), decode_batch(payload).events)

    def shutdown(self) -> None:
        pass
