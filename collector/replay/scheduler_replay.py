"""A replay through vLLM's own `Scheduler` (`--timing scheduler`): everything the scheduler
does to a request, it does here, because it is the scheduler that does it.

Requests enter `Scheduler.add_request` at their arrival times on a virtual clock. Every step
calls `schedule()`, then `update_from_output()` with what a model runner would return: one
sampled token for each request whose scheduled tokens reach its end (a prefill chunk that
does not gets none, as vLLM's runner discards those), the trace's output tokens where it has
them. So chunked prefill, `max_num_batched_tokens`, `max_num_seqs`, preemption and the
prefix-cache lookups are the scheduler's own, as `vllm serve` makes them. kvscope's hooks
attach as the engine plugin attaches them (engine_hooks/scheduler_hooks.py).

A CPU tier is vLLM's own: the scheduler gets the OffloadingConnector that
`--kv-offloading-size` sets up, and the connector's scheduler side plans its loads and stores.
The worker side's copies need a GPU, so a stand-in worker reports every planned transfer done
at the end of the step that planned it (what is cached where is the connector's; how long a
copy takes is not modelled). The tier's stores and drops are the KV events of medium "CPU"
that the scheduler publishes, recorded as a live engine's are (collector/replay/tier_events.py).
The connector's settings and the stand-ins are in scheduler_tier.py.

A step lasts `step_ms`, plus `prefill_us_per_token` for each prompt token it computes (a
resumed request's recomputed output tokens too) and `decode_us_per_token` for each decoded
one: the cost model's parameters are options. The clock stands at a step's start while it
schedules and at its end while vLLM takes its output: a first token, a finish and the blocks
freed are timed when the step ends (the modelled TTFT: collector/queries/latency.py). The
scheduler is built for a model that only
needs a `config.json` (no weights, no tokenizer), with the replay's KV cache groups and pool.
"""

from __future__ import annotations

import json
import tempfile
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collector.model.step_model import StepModel
from collector.model.trace_request import TraceRequest, output_token
from collector.replay.block_manager import (
    MAX_MODEL_LEN,
    CacheSettings,
    cached_prefix_blocks,
    kv_cache_config,
    quiet_torch_imports,
)
from collector.replay.scheduler_tier import (
    TierPublisher,
    TierSettings,
    offloading_config,
    transfers_done,
    transfers_planned,
)
from collector.replay.simulator import CacheTooSmall, VirtualClock, vllm_request
from collector.replay.tier_events import TierEvents
from engine_hooks.hooks import KVCacheHooks
from engine_hooks.scheduler_hooks import SchedulerHooks
from engine_hooks.vllm_api import model_runner_output

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_utils import BlockHash
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.sched.scheduler import Scheduler

    from collector.replay.block_manager import BlockHasher

# What vLLM's ModelConfig reads of a model: a small Llama. Its shape sizes nothing here (the
# KV cache groups and the pool are the replay's); its context is the replay's longest.
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 32_000,
    "max_position_embeddings": MAX_MODEL_LEN,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float16",
}
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # `vllm serve`'s default on a GPU with chunked prefill


@dataclass(frozen=True)
class SchedulerLimits:
    """The scheduler settings a replay varies besides the cache."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    max_loras: int = 1  # vLLM's --max-loras

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_loras"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")


def make_scheduler(
    settings: CacheSettings,
    limits: SchedulerLimits,
    model_dir: Path,
    lora: bool,
    tier: TierSettings | None = None,
) -> Scheduler:
    """vLLM's Scheduler with the settings' pool and KV cache groups, on the CPU; with `tier`,
    vLLM's native CPU offloading as `--kv-offloading-size` sets it up (its KV events on)."""
    quiet_torch_imports()
    from vllm.config import (  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
        CacheConfig,
        DeviceConfig,
        LoRAConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )
    from vllm.config.kv_events import KVEventsConfig  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.v1.core.sched.scheduler import Scheduler  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.v1.structured_output import StructuredOutputManager  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    (model_dir / "config.json").write_text(json.dumps(MODEL_CONFIG))
    model = ModelConfig(
        model=str(model_dir), skip_tokenizer_init=True, max_model_len=MAX_MODEL_LEN, dtype="float16"
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=limits.max_num_seqs,
        max_num_batched_tokens=limits.max_num_batched_tokens,
        max_model_len=MAX_MODEL_LEN,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
    )
    cache = CacheConfig(
        block_size=settings.block_size,
        enable_prefix_caching=True,
        prefix_caching_hash_algo=settings.hash_algo,  # type: ignore[arg-type]
    )
    cache.num_gpu_blocks = settings.num_blocks
    config = kv_cache_config(settings)
    vllm_config = VllmConfig(
        model_config=model,
        scheduler_config=scheduler_config,
        cache_config=cache,
        device_config=DeviceConfig(device="cpu"),
        lora_config=LoRAConfig(max_loras=limits.max_loras) if lora else None,
        kv_transfer_config=offloading_config(config, tier) if tier else None,
        kv_events_config=KVEventsConfig(enable_kv_cache_events=tier is not None, publisher="null"),
    )
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=settings.block_size,
        hash_block_size=settings.block_size,
        log_stats=True,
    )


@dataclass(eq=False)
class SchedulerReplay:
    """One replay through vLLM's Scheduler, hooks attached (a bare run without them)."""

    settings: CacheSettings
    limits: SchedulerLimits
    _: KW_ONLY
    step_model: StepModel
    block_hasher: BlockHasher
    clock: VirtualClock
    on_step: Callable[[], None]
    tier: TierSettings | None = None
    tier_events: TierEvents | None = None
    scheduler: Any = field(init=False, default=None)
    steps: int = field(init=False, default=0)  # steps that scheduled something
    # vLLM's own PrefixCacheStats, summed over the steps
    prefix_cache_queries: int = field(init=False, default=0)
    prefix_cache_hits: int = field(init=False, default=0)
    _trace: dict[str, tuple[int, TraceRequest]] = field(init=False, default_factory=dict)
    _attached: SchedulerHooks | None = field(init=False, default=None)

    def run(
        self,
        trace: list[TraceRequest],
        progress: Callable[[int], None],
        hooks: Callable[[Scheduler], KVCacheHooks] | None = None,
    ) -> None:
        """Replay `trace` on this engine alone; `hooks` builds the KV cache hooks for the
        scheduler's manager."""
        self.start(trace, hooks)
        try:
            run_engines([self], trace, lambda request, index: 0, progress)
        finally:
            self.stop()

    def start(
        self,
        trace: list[TraceRequest],
        hooks: Callable[[Scheduler], KVCacheHooks] | None = None,
    ) -> None:
        """Build the scheduler for `trace` (every request this engine may be sent), hooks
        attached."""
        self._trace = {request.request_id: (index, request) for index, request in enumerate(trace)}
        lora = any(request.lora for request in trace)
        with tempfile.TemporaryDirectory(prefix="kvscope-model-") as model_dir:
            self.scheduler = make_scheduler(
                self.settings, self.limits, Path(model_dir), lora, self.tier
            )
        if self.tier_events is not None:
            self.scheduler.kv_event_publisher = TierPublisher(self.tier_events, self.clock)
        if hooks is not None:
            self._attached = SchedulerHooks(self.scheduler, hooks(self.scheduler), self._tenant)
            self._attached.attach()

    def stop(self) -> None:
        """Take the hooks off the scheduler."""
        if self._attached is not None:
            self._attached.detach()
            self._attached = None

    @property
    def busy(self) -> bool:
        """Whether the scheduler holds requests (or finished ones not yet reported)."""
        return bool(self.scheduler.has_requests())

    @property
    def load(self) -> int:
        """The requests this engine is serving now: waiting and running."""
        return int(self.scheduler.get_num_unfinished_requests())

    @property
    def waiting(self) -> int:
        """The requests waiting, as the engine reports them to vLLM's DP coordinator."""
        return int(self.scheduler.get_request_counts()[1])

    @property
    def running(self) -> int:
        """The requests running, as the engine reports them to vLLM's DP coordinator."""
        return int(self.scheduler.get_request_counts()[0])

    @property
    def kv_usage(self) -> float:
        """How full the KV cache is (0 to 1), as the engine reports it."""
        return float(self.scheduler.get_kv_cache_usage())

    def cached_prefix_blocks(self, block_hashes: Sequence[BlockHash]) -> int:
        """How many of `block_hashes`, from the first, this engine's prefix cache holds."""
        return cached_prefix_blocks(self.scheduler.kv_cache_manager, block_hashes)

    def _tenant(self, request: Any) -> str | None:
        return self._trace[request.request_id][1].tenant

    def arrive(self, trace_request: TraceRequest) -> None:
        """Add a request at its arrival time."""
        self.clock.set_ms(trace_request.timestamp_ms)
        self.scheduler.add_request(vllm_request(trace_request, self.block_hasher))

    def step(self, now_ms: float, progress: Callable[[int], None]) -> tuple[float, bool]:
        """One step beginning at `now_ms`: when the next may begin, and whether the engine
        is stuck (it scheduled nothing, with requests unfinished: none fits until more
        arrive)."""
        scheduler = self.scheduler
        self.clock.set_ms(now_ms)
        output = scheduler.schedule()
        idle = output.total_num_scheduled_tokens == 0
        waiting = idle and not (self.tier and transfers_planned(output))
        stuck = bool(waiting and scheduler.get_num_unfinished_requests())
        prefill, decode = self._tokens(output)
        step = self.step_model
        end_ms = (
            now_ms
            + step.step_ms
            + prefill * step.prefill_us_per_token / 1000
            + decode * step.decode_us_per_token / 1000
        )
        if not idle:  # the step's tokens come out at its end (a first token is timed there)
            self.clock.set_ms(end_ms)
        results = scheduler.update_from_output(output, self._model_output(output))
        for outputs in results.values():
            progress(sum(out.finished for out in outputs.outputs))
            stats = outputs.scheduler_stats
            if stats is not None and stats.prefix_cache_stats is not None:
                self.prefix_cache_queries += stats.prefix_cache_stats.queries
                self.prefix_cache_hits += stats.prefix_cache_stats.hits
        self.on_step()
        if idle:
            return now_ms, stuck
        self.steps += 1
        return end_ms, stuck

    def _tokens(self, output: SchedulerOutput) -> tuple[int, int]:
        """The step's prefill tokens (prompt, or a resumed request's recomputed tokens) and
        decoded ones."""
        prefill = decode = 0
        for request_id, count in output.num_scheduled_tokens.items():
            request = self.scheduler.requests[request_id]
            # The scheduler has counted this step's tokens as computed already.
            if request.num_computed_tokens - count < request.num_tokens - 1:
                prefill += count
            else:
                decode += count
        return prefill, decode

    def _model_output(self, output: SchedulerOutput) -> Any:
        """What a model runner returns: a token for each request this step completes."""
        request_ids = list(output.num_scheduled_tokens)
        sampled = []
        for request_id in request_ids:
            request = self.scheduler.requests[request_id]
            done = request.num_computed_tokens >= request.num_tokens
            sampled.append([self._next_token(request)] if done else [])
        return model_runner_output(
            request_ids,
            sampled_token_ids=sampled,
            kv_connector_output=transfers_done(output) if self.tier else None,
        )

    def _next_token(self, request: Any) -> int:
        index, trace_request = self._trace[request.request_id]
        return output_token(trace_request, index, int(request.num_output_tokens))

    def too_small(self) -> CacheTooSmall:
        """The error of an engine stuck with no request left to arrive."""
        request = next(iter(self.scheduler.waiting))
        return CacheTooSmall.for_request(
            self._trace[request.request_id][1], self.settings.num_blocks
        )


def run_engines(
    engines: Sequence[SchedulerReplay],
    trace: list[TraceRequest],
    route: Callable[[TraceRequest, int], int],
    progress: Callable[[int], None],
) -> None:
    """Replay `trace` across started `engines` on one clock. Each request, at its arrival
    time, goes to the engine `route` names (given the request and its number in arrival
    order); the engine whose next step begins first steps next (of equals, the lowest
    index), and a request arriving by then arrives before it. An idle engine waits for its
    next request; one stuck waits for the next arrival."""
    pending = deque(sorted(trace, key=lambda request: request.timestamp_ms))
    now_ms = [0.0] * len(engines)
    routed = 0
    while True:
        busy = [number for number, engine in enumerate(engines) if engine.busy]
        if not pending and not busy:
            return
        following = min(busy, key=now_ms.__getitem__, default=None)
        if pending and (following is None or pending[0].timestamp_ms <= now_ms[following]):
            request = pending.popleft()
            number = route(request, routed)
            routed += 1
            if not engines[number].busy:
                now_ms[number] = max(now_ms[number], request.timestamp_ms)
            engines[number].arrive(request)
            continue
        assert following is not None
        now_ms[following], stuck = engines[following].step(now_ms[following], progress)
        if stuck:
            if not pending:
                raise engines[following].too_small()
            now_ms[following] = pending[0].timestamp_ms
