"""kvscope's hooks on a vLLM scheduler: its KV cache manager's (engine_hooks/hooks.py) and
the scheduler calls that say what the manager cannot."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine_hooks.hooks import KVCacheHooks


class SchedulerHooks:
    """kvscope's hooks on a scheduler's KV cache manager, and the scheduler calls that say
    what the manager cannot: a request arrived (with its tenant), was scheduled, preempted or
    freed; the pool's state after each step. The plugin's capture and the scheduler replay
    (collector/replay/scheduler_replay.py) attach the same ones."""

    WRAPPED = ("add_request", "schedule", "_preempt_request", "_free_request")

    def __init__(
        self, scheduler: Any, hooks: KVCacheHooks, tenant_of: Callable[[Any], str | None]
    ) -> None:
        self.scheduler = scheduler
        self.hooks = hooks
        self.tenant_of = tenant_of
        self._wrapped: list[str] = []

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
        self.hooks.detach()

    def _wrap_add_request(self, original: Any) -> Any:
        def add_request(request: Any) -> None:
            is_new = request.request_id not in self.scheduler.requests
            original(request)
            if is_new:
                self.hooks.on_arrive(request, tenant=self.tenant_of(request))

        return add_request

    def _wrap_schedule(self, original: Any) -> Any:
        requests = self.scheduler.requests

        def schedule(*args: Any, **kwargs: Any) -> Any:
            output = original(*args, **kwargs)
            for new_request in output.scheduled_new_reqs:
                self.hooks.on_schedule(requests[new_request.req_id])
            for request_id in output.scheduled_cached_reqs.resumed_req_ids:
                self.hooks.on_schedule(requests[request_id])
            self.hooks.record_pool_state()
            return output

        return schedule

    def _wrap__preempt_request(self, original: Any) -> Any:
        def _preempt_request(request: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(request, *args, **kwargs)
            self.hooks.on_preempt(request)
            return result

        return _preempt_request

    def _wrap__free_request(self, original: Any) -> Any:
        def _free_request(request: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(request, *args, **kwargs)
            self.hooks.on_finish(request)
            return result

        return _free_request
