"""kvscope's hooks on a vLLM scheduler: its KV cache manager's (engine_hooks/hooks.py) and
the scheduler calls that say what the manager cannot, the requests' first output tokens
among them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine_hooks.hooks import KVCacheHooks
from engine_hooks.vllm_api import resumed_request_ids


class SchedulerHooks:
    """kvscope's hooks on a scheduler's KV cache manager, and the scheduler calls that say
    what the manager cannot: a request arrived (with its tenant), was scheduled, gave its
    first output token, was preempted or freed; the pool's state after each step. The
    plugin's capture and the scheduler replay (collector/replay/scheduler_replay.py) attach
    the same ones.

    Their own code never raises into vLLM: a failure stops capture of the engine (the hooks'
    `failed`), and these wrappers go with the manager's, leaving the scheduler's own methods
    as they were; then `on_failure` hears why (the plugin tells the collector)."""

    WRAPPED = ("add_request", "schedule", "update_from_output", "_preempt_request", "_free_request")

    def __init__(
        self,
        scheduler: Any,
        hooks: KVCacheHooks,
        tenant_of: Callable[[Any], str | None],
        arrival_clock: Callable[[], int] | None = None,
    ) -> None:
        """`arrival_clock`: the clock, in nanoseconds, of vLLM's `Request.arrival_time` (the
        plugin's: the wall clock); None where arriving at the engine is the arrival (a
        replay)."""
        self.scheduler = scheduler
        self.hooks = hooks
        self.tenant_of = tenant_of
        self.arrival_clock = arrival_clock
        self._wrapped: list[str] = []
        # The requests scheduled without an output token yet, each with the prompt tokens
        # computed for it so far: few (the ones in prefill), so a step looks at them alone.
        self._prefilling: dict[str, list[Any]] = {}
        self.on_failure: Callable[[str], None] | None = None
        hooks.on_failure = self._hooks_failed

    @property
    def attached(self) -> bool:
        return bool(self._wrapped)

    def attach(self) -> SchedulerHooks:
        self.hooks.attach()
        for name in self.WRAPPED:
            setattr(
                self.scheduler, name, getattr(self, f"_wrap_{name}")(getattr(self.scheduler, name))
            )
            self._wrapped.append(name)
        return self

    def detach(self) -> None:
        for name in self._wrapped:
            delattr(self.scheduler, name)
        self._wrapped.clear()
        self._prefilling.clear()
        self.hooks.detach()

    def _hooks_failed(self, failure: str) -> None:
        """The hooks stopped (they detached themselves): the scheduler's wrappers go too."""
        self.detach()
        if self.on_failure is not None:
            self.on_failure(failure)

    def _wrap_add_request(self, original: Any) -> Any:
        def add_request(request: Any, *args: Any, **kwargs: Any) -> None:
            try:
                is_new = request.request_id not in self.scheduler.requests
            except Exception as error:
                self.hooks.failed(error, "Scheduler.add_request")
                is_new = False
            original(request, *args, **kwargs)
            if is_new:
                try:
                    self.hooks.on_arrive(request, tenant=self.tenant_of(request))
                except Exception as error:
                    self.hooks.failed(error, "Scheduler.add_request")

        return add_request

    def _wrap_schedule(self, original: Any) -> Any:
        def schedule(*args: Any, **kwargs: Any) -> Any:
            output = original(*args, **kwargs)
            try:
                self._record_scheduled(output)
            except Exception as error:
                self.hooks.failed(error, "Scheduler.schedule")
            return output

        return schedule

    def _record_scheduled(self, output: Any) -> None:
        """The requests a step schedules for the first time or again after a preemption
        (where each version of vLLM lists them: vllm_api.py), and the pool after it."""
        requests = self.scheduler.requests
        for new_request in output.scheduled_new_reqs:
            request = requests[new_request.req_id]
            self.hooks.on_schedule(request)
            if not request.num_output_tokens:
                self._prefilling.setdefault(request.request_id, [request, 0])
        for request_id in resumed_request_ids(output):
            self.hooks.on_schedule(requests[request_id])
        self.hooks.record_pool_state()

    def _wrap_update_from_output(self, original: Any) -> Any:
        def update_from_output(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            if self._prefilling:
                try:
                    self._count_prefill(scheduler_output)
                except Exception as error:
                    self.hooks.failed(error, "Scheduler.update_from_output")
            result = original(scheduler_output, *args, **kwargs)
            if self._prefilling:
                try:
                    self._record_first_tokens()
                except Exception as error:
                    self.hooks.failed(error, "Scheduler.update_from_output")
            return result

        return update_from_output

    def _count_prefill(self, output: Any) -> None:
        """Add the step's tokens to each prefilling request it scheduled, before vLLM reads
        the step's output (a request finishing on its first token is freed meanwhile)."""
        scheduled = output.num_scheduled_tokens
        for request_id, entry in self._prefilling.items():
            entry[1] += scheduled.get(request_id, 0)

    def _record_first_tokens(self) -> None:
        """The prefilling requests the step gave their first output token."""
        prefilling = self._prefilling
        done = [
            request_id for request_id, entry in prefilling.items() if entry[0].num_output_tokens
        ]
        for request_id in done:
            self._first_token(request_id)

    def _first_token(self, request_id: str) -> None:
        """Record the first output token of a request still counted as prefilling."""
        request, num_tokens = self._prefilling.pop(request_id)
        self.hooks.on_first_token(request, num_tokens, self._age_ns(request))

    def _age_ns(self, request: Any) -> int | None:
        """The time since the request's arrival at vLLM's front end, if its clock is known."""
        if self.arrival_clock is None:
            return None
        return self.arrival_clock() - round(float(request.arrival_time) * 1e9)

    def _wrap__preempt_request(self, original: Any) -> Any:
        def _preempt_request(request: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(request, *args, **kwargs)
            try:
                self.hooks.on_preempt(request)
            except Exception as error:
                self.hooks.failed(error, "Scheduler._preempt_request")
            return result

        return _preempt_request

    def _wrap__free_request(self, original: Any) -> Any:
        def _free_request(request: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(request, *args, **kwargs)
            try:
                if request.num_output_tokens and request.request_id in self._prefilling:
                    self._first_token(request.request_id)  # freed on its one token
                self._prefilling.pop(request.request_id, None)
                self.hooks.on_finish(request)
            except Exception as error:
                self.hooks.failed(error, "Scheduler._free_request")
            return result

        return _free_request
