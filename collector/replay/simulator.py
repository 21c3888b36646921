"""Drives vLLM's real `KVCacheManager` through a trace, the way vLLM's scheduler calls it.

Per admitted request, the calls are the scheduler's own: `get_computed_blocks`, then
`allocate_slots` for the tokens to compute, then `record_prefix_cache_stats`; output tokens
are appended to the `Request` (vLLM hashes the new full blocks itself) and get slots from
`allocate_slots`; a finished or preempted request is `free`d.

Two timings:
- sequential: one request at a time in file order. Prefill, then its `output_length` tokens
  decoded (no other request runs meanwhile, so one `allocate_slots` call for the whole
  decode gives the same blocks as one call per token), then free. Clock: each request's
  events carry its trace timestamp.
- timestamps: a step model. Requests arrive on the trace's clock; each step first decodes
  one token for every running request (oldest first), preempting the newest running request
  when a slot cannot be had (vLLM's recompute preemption: blocks freed, the request goes
  back to the front of the queue), then admits waiting requests in arrival order while fewer
  than `max_num_seqs` run and their whole prompt fits (no chunked prefill, no token budget).
  A step lasts `step_ms` plus `prefill_us_per_token` for every prompt token it computes.

With a CPU tier (`collector/replay/cpu_tier.py`), admission calls it as vLLM's offloading
connector does: after the GPU hit, the tier is looked up block by block; the blocks it holds
from there on are passed to `allocate_slots` as the connector's external tokens and loaded
back once the slots are had (so the prefill computes only the rest), and the prompt's full
blocks are offered to the tier (it stores those it does not hold).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING

from collector.model.step_model import StepModel
from collector.model.trace_request import TraceRequest, output_token
from collector.replay.block_manager import make_request
from engine_hooks.hooks import KVCacheHooks

if TYPE_CHECKING:  # vLLM is imported where it runs, so `kvscope` starts without it
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import BlockHash
    from vllm.v1.request import Request

    from collector.replay.block_manager import BlockHasher
    from collector.replay.cpu_tier import CpuTier

NS_PER_MS = 1_000_000


class CacheTooSmall(ValueError):
    """A request that could never fit in the cache, even alone."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")
        self.line = line
        self.reason = reason

    @classmethod
    def for_request(cls, trace_request: TraceRequest, num_blocks: int) -> CacheTooSmall:
        """`trace_request` does not fit in a pool of `num_blocks` (the null block included)."""
        return cls(
            trace_request.line,
            f"request {trace_request.request_id} needs more than the {num_blocks - 1} usable "
            "blocks of the cache; raise --num-blocks",
        )


def vllm_request(trace_request: TraceRequest, block_hasher: BlockHasher) -> Request:
    """The vLLM `Request` of a trace's request, arriving at its trace time."""
    return make_request(
        trace_request.request_id,
        trace_request.prompt_token_ids(),
        block_hasher,
        max_tokens=trace_request.output_length,
        arrival_time=trace_request.timestamp_ms / 1000,
        lora_name=trace_request.lora,
        cache_salt=trace_request.cache_salt,
    )


class VirtualClock:
    """The trace's clock, in nanoseconds, as the hooks read it."""

    def __init__(self) -> None:
        self.now_ns = 0

    def __call__(self) -> int:
        return self.now_ns

    def set_ms(self, milliseconds: float) -> None:
        self.now_ns = round(milliseconds * NS_PER_MS)


@dataclass(eq=False)
class Simulator:
    """One replay: a manager, its hooks (None for a bare run), a clock, a callback per step."""

    manager: KVCacheManager
    hooks: KVCacheHooks | None
    clock: VirtualClock
    block_hasher: BlockHasher
    on_step: Callable[[], None]
    _: KW_ONLY
    tier: CpuTier | None = None
    _index: dict[str, int] = field(init=False, default_factory=dict)

    # -- shared steps ---------------------------------------------------------------

    def _arrive(self, trace_request: TraceRequest, index: int) -> Request:
        request = vllm_request(trace_request, self.block_hasher)
        self._index[request.request_id] = index
        if self.hooks:
            self.hooks.on_arrive(request, tenant=trace_request.tenant)
        return request

    def _admit(self, request: Request) -> int | None:
        """Look up the prefix and allocate the whole prefill, as the scheduler does.

        Returns the number of tokens the prefill computes, or None when it does not fit.
        """
        from vllm.v1.request import RequestStatus  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

        blocks, num_hit_tokens, boundary = self.manager.get_computed_blocks(request)
        # As the scheduler does: a window group then keeps the blocks at the boundary of a
        # prefix another group cached further (the hit's third value), to serve it later.
        request.shared_prefix_boundary = boundary
        block_size = self.manager.block_pool.hash_block_size
        tier_keys, num_tier_blocks = self._look_up_tier(request, num_hit_tokens)
        num_tier_tokens = num_tier_blocks * block_size
        num_new_tokens = request.num_tokens - num_hit_tokens - num_tier_tokens
        if (
            self.manager.allocate_slots(
                request,
                num_new_tokens,
                num_hit_tokens,
                blocks,
                num_external_computed_tokens=num_tier_tokens,
            )
            is None
        ):
            if self.tier:
                self.tier.finish()
            return None
        if self.tier:
            self.tier.load(tier_keys[:num_tier_blocks])
            # The connector offers the tier the prompt's full blocks from the first on (GPU
            # hits too: it holds what it holds, and takes the rest).
            self.tier.store(request.block_hashes[: request.num_prompt_tokens // block_size])
            self.tier.finish()
        self.manager.record_prefix_cache_stats(request, num_hit_tokens)
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = request.num_tokens
        if self.hooks:
            self.hooks.on_schedule(request)
        return int(num_new_tokens)

    def _look_up_tier(self, request: Request, num_hit_tokens: int) -> tuple[list[BlockHash], int]:
        """The prompt's full blocks after the GPU hit, and how many of them, from the first,
        the tier holds: up to the block before the last token, as a GPU hit goes."""
        if self.tier is None:
            return [], 0
        self.tier.start(request.request_id)
        block_size = self.manager.block_pool.hash_block_size
        first = num_hit_tokens // block_size
        keys = list(request.block_hashes[first : request.num_prompt_tokens // block_size])
        limit = (request.num_tokens - 1) // block_size - first
        return keys, self.tier.lookup(keys[:limit])

    def _output_tokens(self, trace_request: TraceRequest, start: int, count: int) -> list[int]:
        index = self._index[trace_request.request_id]
        return [
            output_token(trace_request, index, position) for position in range(start, start + count)
        ]

    def _finish(self, request: Request) -> None:
        from vllm.v1.request import RequestStatus  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        self.manager.free(request)
        if self.hooks:
            self.hooks.on_finish(request)

    def _step_done(self) -> None:
        if self.hooks:
            self.hooks.record_pool_state()
        self.on_step()

    def _too_small(self, trace_request: TraceRequest) -> CacheTooSmall:
        return CacheTooSmall.for_request(trace_request, self.manager.block_pool.num_gpu_blocks)

    # -- sequential -----------------------------------------------------------------

    def run_sequential(
        self,
        trace: list[TraceRequest],
        progress: Callable[[int], None],
        first_index: int = 0,
    ) -> None:
        """One request at a time; `first_index` numbers the first request (its index in the
        whole trace, when the trace comes in pieces: it seeds its output tokens)."""
        for index, trace_request in enumerate(trace, first_index):
            self.clock.set_ms(trace_request.timestamp_ms)
            request = self._arrive(trace_request, index)
            if self._admit(request) is None:
                raise self._too_small(trace_request)
            output_length = trace_request.output_length
            if output_length:
                request.append_output_token_ids(
                    self._output_tokens(trace_request, 0, output_length)
                )
            self._step_done()
            if output_length > 1:
                if self.manager.allocate_slots(request, output_length - 1) is None:
                    raise self._too_small(trace_request)
                request.num_computed_tokens += output_length - 1
            self._finish(request)
            self._step_done()
            progress(1)

    # -- timestamps -----------------------------------------------------------------

    def run_timestamps(
        self,
        trace: list[TraceRequest],
        max_num_seqs: int,
        step_model: StepModel,
        progress: Callable[[int], None],
    ) -> None:
        pending = deque(sorted(enumerate(trace), key=lambda item: item[1].timestamp_ms))
        by_id = {trace_request.request_id: trace_request for trace_request in trace}
        waiting: deque[Request] = deque()
        running: list[Request] = []
        now_ms = 0.0
        while pending or waiting or running:
            if not waiting and not running:
                now_ms = max(now_ms, pending[0][1].timestamp_ms)
            while pending and pending[0][1].timestamp_ms <= now_ms:
                index, trace_request = pending.popleft()
                self.clock.set_ms(trace_request.timestamp_ms)
                waiting.append(self._arrive(trace_request, index))
            self.clock.set_ms(now_ms)
            self._decode(running, waiting, by_id, progress)
            num_prefill_tokens = self._prefill(running, waiting, by_id, max_num_seqs)
            self._step_done()
            now_ms += (
                step_model.step_ms + num_prefill_tokens * step_model.prefill_us_per_token / 1000
            )

    def _decode(
        self,
        running: list[Request],
        waiting: deque[Request],
        by_id: dict[str, TraceRequest],
        progress: Callable[[int], None],
    ) -> None:
        """One output token for each running request: finish those done; when the pool runs
        out, preempt from the back of the running list, as vLLM's scheduler does."""
        for request in list(running):
            if request not in running:
                continue  # preempted earlier in this step
            trace_request = by_id[request.request_id]
            if request.num_output_tokens >= trace_request.output_length:
                running.remove(request)
                self._finish(request)
                progress(1)
                continue
            while self.manager.allocate_slots(request, 1) is None:
                victim = running.pop()
                self._preempt(victim)
                waiting.appendleft(victim)
                if victim is request:
                    break
            else:
                request.num_computed_tokens += 1
                request.append_output_token_ids(
                    self._output_tokens(trace_request, request.num_output_tokens, 1)
                )

    def _preempt(self, victim: Request) -> None:
        from vllm.v1.request import RequestStatus  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

        self.manager.free(victim)
        victim.status = RequestStatus.PREEMPTED
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        if self.hooks:
            self.hooks.on_preempt(victim)

    def _prefill(
        self,
        running: list[Request],
        waiting: deque[Request],
        by_id: dict[str, TraceRequest],
        max_num_seqs: int,
    ) -> int:
        """Admit waiting requests in order while they fit; returns the prefill tokens."""
        num_prefill_tokens = 0
        while waiting and len(running) < max_num_seqs:
            request = waiting[0]
            num_computed = self._admit(request)
            if num_computed is None:
                if not running:
                    raise self._too_small(by_id[request.request_id])
                break
            waiting.popleft()
            running.append(request)
            num_prefill_tokens += num_computed
            trace_request = by_id[request.request_id]
            if request.num_output_tokens < trace_request.output_length:
                request.append_output_token_ids(
                    self._output_tokens(trace_request, request.num_output_tokens, 1)
                )
        return num_prefill_tokens
