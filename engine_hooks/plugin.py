"""kvscope's vLLM plugin (entry point group `vllm.general_plugins`).

The capture of a scheduler is reachable as `scheduler.kvscope_capture` (its hooks, buffer and
transport counters), for operators who want to look inside a running engine.

vLLM calls `register()` in every process it starts. With KVSCOPE_CAPTURE unset or 0 it
returns at once and changes nothing. With capture on, it wraps `Scheduler.__init__` so that
the engine-core process, right after building its scheduler, attaches kvscope's hooks to
that scheduler's KV cache manager and starts the transport to `kvscope collect`; and it gives
the engine-core process time to flush its last records when vLLM shuts it down (below).
Anything unexpected (an unsupported vLLM version, a vLLM without a method or argument the
hooks rely on (engine_hooks/vllm_api.py), an unsupported KV cache layout, a bad setting) is
logged as one error line and the engine runs on without capture. Once attached, a hook
whose own code fails stops capturing that engine, says so in one line and to the collector
(the run records why), and vLLM's call goes on as if no hook were there.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import logging
import time
from typing import Any

from engine_hooks.buffer import EventBuffer
from engine_hooks.config import CaptureConfig, checks_collisions
from engine_hooks.endpoint import engine_token
from engine_hooks.hooks import KVCacheHooks
from engine_hooks.privacy import Pseudonymizer, load_secret
from engine_hooks.scheduler_hooks import SchedulerHooks
from engine_hooks.transport import Transport
from engine_hooks.versions import is_supported, supported_versions
from engine_hooks.vllm_api import contract_problems

logger = logging.getLogger("vllm.kvscope")  # vLLM's own handlers print it

TENANT_ARGUMENT = "kvscope_tenant"
ENGINE_EXIT_MARGIN_S = 5.0  # the engine core's own teardown before the scheduler's shutdown
DEFAULT_PROCESS_GRACE_S = 5.0  # vLLM's process manager's, when it is given no timeout
_PATCHED = "_kvscope_patched"


def register() -> None:
    """Entry point: switch capture on in this process if the environment asks for it."""
    try:
        config = CaptureConfig.from_environment()
    except ValueError as error:
        logger.error("kvscope: capture disabled: %s", error)
        return
    if not config.enabled:
        return
    try:
        import vllm  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
        from vllm.v1.core.sched.scheduler import Scheduler  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    except ImportError as error:
        logger.error("kvscope: capture disabled: cannot import vLLM's v1 scheduler: %s", error)
        return
    if not is_supported(str(vllm.__version__)):
        logger.error(
            "kvscope: capture disabled: vLLM %s is not supported (kvscope supports %s)",
            vllm.__version__,
            supported_versions(),
        )
        return
    problems = contract_problems()
    if problems:
        logger.error(
            "kvscope: capture disabled: vLLM %s lacks what the hooks rely on: %s",
            vllm.__version__,
            "; ".join(problems),
        )
        return
    if getattr(Scheduler.__init__, _PATCHED, False):
        return
    original_init = Scheduler.__init__

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        try:
            # Read again: the settings in force when this engine is built are the ones it uses.
            engine_config = CaptureConfig.from_environment()
            if engine_config.enabled:
                self.kvscope_capture = Capture(self, engine_config).start()
        except Exception as error:  # the engine must run on, with or without kvscope
            logger.error("kvscope: capture disabled for this engine: %s", error)

    setattr(__init__, _PATCHED, True)
    Scheduler.__init__ = __init__  # type: ignore[method-assign]
    _give_the_engine_time_to_flush(config.flush_timeout_s + ENGINE_EXIT_MARGIN_S)


def _give_the_engine_time_to_flush(grace_s: float) -> None:
    """Let the engine-core process flush its records when vLLM shuts it down.

    With `--shutdown-timeout 0` (vLLM's default: abort requests at once) vLLM's process
    manager sends the engine core SIGTERM and kills it with SIGKILL at once, before the
    scheduler's `shutdown` can run; ROCm gets a grace period there for its teardown. With
    capture on, every platform gets one of `grace_s`: requests are still aborted at once,
    and the engine core, which exits as soon as it is done, has time to hand its last
    records to the collector. A drain timeout the user set is left exactly as it is.

    An engine whose owner is collected instead of shut down (an offline `LLM` at interpreter
    exit) is stopped by vLLM's finalizer, `shutdown(processes)` with no timeout (5 s, which a
    busy machine's worker teardown alone can take): it gets the grace too.
    """
    try:
        from vllm.v1.engine import utils as engine_utils  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

        original = engine_utils.get_engine_process_shutdown_timeout
        original_shutdown = getattr(engine_utils, "shutdown")  # noqa: B009 - not exported
    except (ImportError, AttributeError) as error:
        logger.warning("kvscope: the last records may be lost at shutdown: %s", error)
        return
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def get_engine_process_shutdown_timeout(
        request_timeout: float | None, process_timeout: float | None
    ) -> float | None:
        timeout: float | None = original(request_timeout, process_timeout)
        if request_timeout != 0:
            return timeout
        return max(DEFAULT_PROCESS_GRACE_S if timeout is None else timeout, grace_s)

    @functools.wraps(original_shutdown)
    def shutdown(processes: list[Any], timeout: float | None = None) -> None:
        original_shutdown(processes, grace_s if timeout is None else timeout)

    setattr(get_engine_process_shutdown_timeout, _PATCHED, True)
    engine_utils.get_engine_process_shutdown_timeout = get_engine_process_shutdown_timeout
    setattr(engine_utils, "shutdown", shutdown)  # noqa: B010 - not exported


class Capture:
    """kvscope inside one scheduler: hooks on its KV cache manager, request context, transport."""

    def __init__(self, scheduler: Any, config: CaptureConfig) -> None:
        self.scheduler = scheduler
        self.config = config
        vllm_config = scheduler.vllm_config
        dp_rank = int(vllm_config.parallel_config.data_parallel_rank or 0)
        self.buffer = EventBuffer(config.buffer_capacity)
        self.pseudonymizer = Pseudonymizer(load_secret(), reveal_tenants=config.reveal_tenants)
        self.check_collisions = checks_collisions(config.check_collisions)
        self.hooks = KVCacheHooks(
            scheduler.kv_cache_manager,
            self.buffer,
            pseudonymizer=self.pseudonymizer,
            clock=time.monotonic_ns,
            record_token_ids=config.record_token_ids,
            check_collisions=self.check_collisions,
        )
        self.transport = Transport(
            self.buffer,
            config.endpoint,
            engine_id=config.engine_id,
            dp_rank=dp_rank,
            config=self._run_config(),
            lost_in_engine=lambda: self.hooks.num_lost,
            next_seq=lambda: self.hooks.num_records,
            max_in_flight=config.max_in_flight,
            max_backlog_bytes=int(config.max_backlog_mb * (1 << 20)),
            token=engine_token(),
            clock=time.monotonic_ns,
        )
        # vLLM's front end stamps a request's arrival on the wall clock (`time.time()`).
        self.scheduler_hooks = SchedulerHooks(
            scheduler, self.hooks, self.tenant_of, arrival_clock=time.time_ns
        )
        self.scheduler_hooks.on_failure = self.transport.report_stopped
        self._stopped = False

    def _run_config(self) -> dict[str, Any]:
        import vllm  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

        vllm_config = self.scheduler.vllm_config
        return {
            "block_size": self.hooks.block_size,
            "num_blocks": int(self.scheduler.kv_cache_manager.block_pool.num_gpu_blocks),
            "hash_algo": str(vllm_config.cache_config.prefix_caching_hash_algo),
            "vllm_version": str(vllm.__version__),
            "model": str(vllm_config.model_config.model),
            "max_num_seqs": int(vllm_config.scheduler_config.max_num_seqs),
            "check_collisions": self.check_collisions,
            "record_token_ids": self.config.record_token_ids,
            "kv_groups": [dataclasses.asdict(group) for group in self.hooks.layout.groups],
        }

    def start(self) -> Capture:
        self.scheduler_hooks.attach()
        self.scheduler.shutdown = self._wrap_shutdown(self.scheduler.shutdown)
        self.transport.start()
        atexit.register(self.stop)
        logger.info(
            "kvscope: capturing block events of engine %s to %s",
            self.config.engine_id,
            self.config.endpoint,
        )
        return self

    def stop(self) -> None:
        """Detach everything and flush what is buffered to the collector (idempotent; the
        hooks may have detached themselves already, after a failure of their own)."""
        if self._stopped:
            return
        self._stopped = True
        del self.scheduler.shutdown
        self.scheduler_hooks.detach()
        transport = self.transport
        transport.stop(self.config.flush_timeout_s)
        atexit.unregister(self.stop)
        logger.info(
            "kvscope: engine %s stopped capturing: %d records, %d delivered, "
            "%d dropped in transport, %d lost in the engine's buffer%s",
            self.config.engine_id,
            self.hooks.num_records,
            transport.num_delivered,
            transport.num_dropped,
            self.hooks.num_lost,
            f"; capture had stopped: {self.hooks.failure}" if self.hooks.failure else "",
        )

    def tenant_of(self, request: Any) -> str | None:
        """The tenant label the user passed (`extra_args`), or the salt's pseudonym if asked."""
        if self.config.tenant_from_salt:
            return self.pseudonymizer.salt(request.cache_salt)
        params = request.sampling_params
        extra = params.extra_args if params is not None else None
        tenant = extra.get(TENANT_ARGUMENT) if extra else None
        return str(tenant) if tenant is not None else None

    def _wrap_shutdown(self, original: Any) -> Any:
        def shutdown() -> None:
            self.stop()
            original()

        return shutdown
