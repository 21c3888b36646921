"""vLLM's real Scheduler on the CPU, a real `kvscope collect` process, and a driver loop."""

from __future__ import annotations

import json
import mmap
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from collector.replay.block_manager import CacheSettings, make_block_hasher, make_kv_cache_manager
from collector.replay.scheduler_replay import MODEL_CONFIG
from collector.replay.simulator import Simulator, VirtualClock
from collector.replay.traces import read_trace
from collector.replay.workload import WorkloadShape, generate
from collector.store.run_file import RunFile
from engine_hooks import EventBuffer, KVCacheHooks, Pseudonymizer
from engine_hooks.transport import Transport
from engine_hooks.vllm_api import model_runner_output
from tests.support.repo import REPO, SAMPLE_TRACE

# The scheduler replay's model config, at an 8k context, with BOS and EOS.
TINY_LLAMA = {
    **MODEL_CONFIG,
    "max_position_embeddings": 8192,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def make_scheduler(
    model_dir: Path,
    block_size: int,
    num_blocks: int,
    max_num_seqs: int,
    *,
    mamba: bool = False,
    mamba_checkpoints: bool = False,
    kv_events: bool = False,
    max_num_batched_tokens: int = 4096,
    cpu_tier_blocks: int = 0,
) -> Any:
    """vLLM's own Scheduler for a tiny Llama config: one full-attention KV cache group, and
    with `mamba` a Mamba group beside it cached as vLLM caches one ("align" mode, block-aligned
    prefill chunks), as in a Qwen3-Next-like hybrid; with `mamba_checkpoints` its states are
    exported inside a chunk instead, as vLLM's Mamba 2 layers do (a prefill checkpoint block);
    `kv_events` turns on vLLM's KV events; `cpu_tier_blocks` adds vLLM's native CPU offloading
    (its OffloadingConnector, scheduler side) with room for that many blocks."""
    import torch  # noqa: PLC0415 - torch takes seconds to load; only what drives vLLM pays
    from vllm.config import (  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
        CacheConfig,
        DeviceConfig,
        KVTransferConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )
    from vllm.config.kv_events import KVEventsConfig  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.v1.core.sched.scheduler import Scheduler  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.v1.kv_cache_interface import (  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
    )
    from vllm.v1.structured_output import StructuredOutputManager  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(TINY_LLAMA))
    model = ModelConfig(
        model=str(model_dir), skip_tokenizer_init=True, max_model_len=8192, dtype="float16"
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=8192,
        is_encoder_decoder=False,
    )
    cache = CacheConfig(
        block_size=block_size,
        enable_prefix_caching=True,
        mamba_cache_mode="align" if mamba else "none",
    )
    cache.num_gpu_blocks = num_blocks
    spec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=2, head_size=16, dtype=torch.float16
    )
    # What `--kv-offloading-size` sets up, in bytes of this spec's blocks (vLLM rounds each
    # up to whole memory pages: this tiny model's are smaller than one).
    page_bytes = -(-spec.page_size_bytes // mmap.PAGESIZE) * mmap.PAGESIZE
    offloading = KVTransferConfig(
        kv_connector="OffloadingConnector",
        kv_role="kv_both",
        kv_connector_extra_config={"cpu_bytes_to_use": cpu_tier_blocks * page_bytes},
    )
    vllm_config = VllmConfig(
        model_config=model,
        scheduler_config=scheduler_config,
        cache_config=cache,
        device_config=DeviceConfig(device="cpu"),
        kv_events_config=KVEventsConfig(enable_kv_cache_events=kv_events, publisher="null"),
        kv_transfer_config=offloading if cpu_tier_blocks else None,
    )
    groups = [KVCacheGroupSpec(["model.layers.0.self_attn"], spec)]
    if mamba:
        state = MambaSpec(
            block_size=block_size,
            shapes=((4, 16),),
            dtypes=(torch.float16,),
            mamba_cache_mode="align",
            num_prefill_checkpoint_blocks=int(mamba_checkpoints),
            prefill_checkpoint_alignment=1 if mamba_checkpoints else None,
        )
        groups.append(KVCacheGroupSpec(["model.layers.1.linear_attn"], state))
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=groups,
        # As vLLM's engine plans it: 0 keeps a Mamba group's states only where a later
        # request can resume (each prompt's last block boundary).
        prefix_cache_retention_interval=cache.prefix_cache_retention_interval,
    )
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block_size,
        hash_block_size=block_size,
        log_stats=True,
    )


@dataclass
class DriveResult:
    steps: int
    queries: int
    hits: int
    preempted_queries: int
    preempted_hits: int
    finished: int


def drive(
    scheduler: Any, rows: list[dict[str, Any]], per_step: int, stop_after: int | None = None
) -> DriveResult:
    """Add `per_step` trace rows per step and run schedule / update_from_output with fake
    model outputs (one deterministic token per scheduled request) until all finish."""
    from vllm.sampling_params import SamplingParams  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.utils.hashing import get_hash_fn_by_name  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.v1.request import Request  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    block_size = scheduler.block_size
    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    block_hasher = get_request_block_hasher(block_size, hash_fn)
    result = DriveResult(0, 0, 0, 0, 0, 0)
    pending = list(rows)
    while pending or scheduler.has_requests():
        for row in pending[:per_step]:
            params = SamplingParams(
                max_tokens=max(row["output_length"], 1),
                ignore_eos=True,
                extra_args={"kvscope_tenant": row["tenant"]} if row.get("tenant") else None,
            )
            scheduler.add_request(
                Request(
                    row["request_id"],
                    row["token_ids"],
                    params,
                    None,
                    arrival_time=time.time(),
                    cache_salt=row.get("cache_salt"),
                    block_hasher=block_hasher,
                )
            )
        del pending[:per_step]
        output = scheduler.schedule()
        request_ids = [new.req_id for new in output.scheduled_new_reqs]
        request_ids += list(output.scheduled_cached_reqs.req_ids)
        model_output = model_runner_output(
            request_ids,
            sampled_token_ids=[[1000 + result.steps % 7] for _ in request_ids],
        )
        for engine_outputs in scheduler.update_from_output(output, model_output).values():
            result.finished += sum(1 for out in engine_outputs.outputs if out.finished)
            stats = engine_outputs.scheduler_stats
            if stats is not None and stats.prefix_cache_stats is not None:
                result.queries += stats.prefix_cache_stats.queries
                result.hits += stats.prefix_cache_stats.hits
                result.preempted_queries += stats.prefix_cache_stats.preempted_queries
                result.preempted_hits += stats.prefix_cache_stats.preempted_hits
        result.steps += 1
        if stop_after is not None and result.steps >= stop_after:
            break
    return result


@contextmanager
def collector_process(
    run_path: Path, endpoint: str, *extra_args: str
) -> Iterator[subprocess.Popen[str]]:
    """`kvscope collect` in a second process, up and listening when the block starts."""
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "collector.cli",
            "collect",
            "--db",
            str(run_path),
            "--endpoint",
            endpoint,
            "--live-interval",
            "0.5",
            *extra_args,
        ],
        cwd=REPO,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert "listening" in line, line
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)


def stop_collector(process: subprocess.Popen[str]) -> str:
    """SIGTERM the collector (it catches up through vLLM's replay socket first, when
    subscribed to one); its output."""
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0
    assert process.stdout is not None
    output = process.stdout.read()
    assert "Traceback" not in output, output
    return output


def stored_record_numbers(run: Path) -> list[int]:
    """Every record number a run file holds, in order (drop rows are the collector's)."""

    with RunFile.open(run) as run_file:
        rows = run_file.rows(
            "SELECT DISTINCT seq FROM ("
            " SELECT seq FROM events WHERE kind <> 'drop'"
            " UNION ALL SELECT seq FROM pool UNION ALL SELECT seq FROM collisions) ORDER BY seq"
        )
    return [int(row[0]) for row in rows]


def recorded_drops(run: Path) -> int:
    """The records a run file says are missing (its drop rows)."""

    with RunFile.open(run) as run_file:
        row = run_file.row("SELECT coalesce(sum(num_lost), 0) FROM events WHERE kind = 'drop'")
    assert row is not None
    return int(row[0])


def wait_for(condition: Callable[[], object], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("timed out")
        time.sleep(0.1)


def replay_to_collector(
    endpoint: str, num_requests: int, engine_id: str, *, start_ns: int | None = None
) -> tuple[Any, Any]:
    """The sample trace's first requests through vLLM's real manager, hooks attached, shipped
    by a transport to `endpoint`; returns (hooks, transport) once all is delivered. With
    `start_ns`, the records are timed from it on the trace's clock, and the transport's
    closing batch (`transport.stop()`) says where the stream ended and when the engine
    stopped, on that clock, as the plugin's does; without, it sends none."""
    settings = CacheSettings(16, 2_000)
    manager = make_kv_cache_manager(settings)
    buffer = EventBuffer()
    clock = VirtualClock()
    timed: Callable[[], int] = clock if start_ns is None else lambda: start_ns + clock()
    hooks = KVCacheHooks(manager, buffer, pseudonymizer=Pseudonymizer(b"k"), clock=timed)
    hooks.attach()
    config = {"block_size": 16, "num_blocks": 2_000, "hash_algo": "sha256", "vllm_version": "0"}
    # As the plugin's: the stop timed on the records' clock, after the engine's last record.
    as_plugin = {} if start_ns is None else {"clock": timed, "next_seq": lambda: hooks.num_records}
    transport = Transport(buffer, endpoint, engine_id=engine_id, config=config, **as_plugin)
    transport.start()
    simulator = Simulator(manager, hooks, clock, make_block_hasher(settings), lambda: None)
    simulator.run_sequential(read_trace(SAMPLE_TRACE)[:num_requests], lambda _: None)
    wait_for(lambda: transport.num_delivered == hooks.num_records)
    return hooks, transport


BLOCK_SIZE = 16


def workload() -> list[dict[str, Any]]:
    rows = generate(WorkloadShape(seed=11, num_chats=30, num_rag_requests=150, num_reports=40))
    return rows[:300]


def workload_scheduler(model_dir: Path) -> Any:
    """vLLM's Scheduler that `workload()` is driven through: 700 blocks of BLOCK_SIZE tokens,
    24 requests running at most."""
    return make_scheduler(model_dir, BLOCK_SIZE, num_blocks=700, max_num_seqs=24)


KILL_AFTER_STEPS = 40


def kill_collector_mid_run(
    process: subprocess.Popen[str],
    scheduler: Any,
    rows: list[dict[str, Any]],
    settle_s: float = 0.0,
) -> DriveResult:
    """Drive the first KILL_AFTER_STEPS steps (3 rows a step), wait until the collector has
    stored something, let it run `settle_s` more, then SIGKILL it."""
    result = drive(scheduler, rows, per_step=3, stop_after=KILL_AFTER_STEPS)
    transport = scheduler.kvscope_capture.transport
    deadline = time.monotonic() + 60
    while transport.num_delivered == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(settle_s)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    return result
