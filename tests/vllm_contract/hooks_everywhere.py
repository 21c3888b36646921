"""A pytest plugin for vLLM's own test session: kvscope's hooks on every `KVCacheManager` and
`Scheduler` vLLM's tests build (tests/test_vllm_contract.py loads it with `-p`).

`Scheduler.__init__` is wrapped to attach the plugin's `SchedulerHooks` to the scheduler's
manager, as the plugin's `Capture` does in an engine; `KVCacheManager.__init__` to attach
`KVCacheHooks` to every manager built outside a scheduler (the tests of the manager alone).
A manager built while a scheduler is being built waits for that scheduler, so no manager is
hooked twice. Every hook records as much as it can: token ids, and the collision check (the
hooks' fingerprints of every cached block, which read most of a request's state).

A manager whose layout the hooks refuse (`UnsupportedCacheLayout`) is left unhooked and
counted by reason. The hooks' own failures (`KVCacheHooks.failed`: caught at the hook's edge,
capture of that manager stops, vLLM's call goes on) are counted with the test they happened
in. Records are counted, not kept, so memory stays flat over hundreds of managers.

At the end of the session the counts go, as JSON, to the file $KVSCOPE_CONTRACT_COUNTS names.
This module is imported by its own name (its folder on PYTHONPATH): the session runs in a
vLLM version folder whose own `tests` package would shadow kvscope's.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from engine_hooks.buffer import EventBuffer
from engine_hooks.events import Event
from engine_hooks.hooks import KVCacheHooks
from engine_hooks.layout import UnsupportedCacheLayout
from engine_hooks.privacy import Pseudonymizer
from engine_hooks.scheduler_hooks import SchedulerHooks

COUNTS_ENV = "KVSCOPE_CONTRACT_COUNTS"
PSEUDONYMIZER = Pseudonymizer(b"vllm-contract")


@dataclass
class Tally:
    """What the hooks met in this session."""

    hooked: int = 0  # managers with hooks attached
    hooked_by_scheduler: int = 0  # of them, through a scheduler's SchedulerHooks
    refused: Counter[str] = field(default_factory=Counter)  # by reason, figures as N
    attach_errors: Counter[str] = field(default_factory=Counter)  # any other error at attach
    # One per manager whose hooks failed: {test, failure (the first: they detach then),
    # num_failures (all they caught: a wrapper on the stack at the time may catch more)}
    failures: list[dict[str, Any]] = field(default_factory=list)
    records: int = 0
    tests_hooked: set[str] = field(default_factory=set)  # tests that built a hooked manager

    def as_json(self) -> dict[str, Any]:
        import vllm  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

        return {
            "vllm_version": str(vllm.__version__),
            "hooked": self.hooked,
            "hooked_by_scheduler": self.hooked_by_scheduler,
            "refused": dict(self.refused),
            "attach_errors": dict(self.attach_errors),
            "failures": self.failures,
            "records": self.records,
            "tests_hooked": sorted(self.tests_hooked),
        }


TALLY = Tally()
_test = "(outside a test)"  # the test running now
_building: list[list[Any]] = []  # per scheduler being built, the managers it built
_failed: list[tuple[dict[str, Any], KVCacheHooks]] = []  # hooks that failed in this test


class CountingBuffer(EventBuffer):
    """Counts the records the hooks offer and keeps none of them."""

    def offer(self, records: list[Event]) -> bool:
        TALLY.records += len(records)
        return True


def _reason(error: Exception) -> str:
    """The error's text with its figures as N: one count per kind of reason."""
    return re.sub(r"\d+", "N", str(error))


def _tenant(request: Any) -> str | None:
    """A request's tenant, as the plugin names it with KVSCOPE_TENANT_FROM_SALT: its salt's
    pseudonym (None without a salt)."""
    return PSEUDONYMIZER.salt(request.cache_salt)


def _on_failure(hooks: KVCacheHooks, failure: str) -> None:
    """The hooks of one manager stopped after a failure of their own (`hooks.failure`): how
    many they caught in all is read when the test ends."""
    entry: dict[str, Any] = {"test": _test, "failure": failure}
    TALLY.failures.append(entry)
    _failed.append((entry, hooks))


def _count_failures() -> None:
    """How many failures the hooks that failed since the last call caught in all."""
    for entry, hooks in _failed:
        entry["num_failures"] = hooks.num_failures
    _failed.clear()  # the managers may go


def _attach(manager: Any, scheduler: Any = None) -> None:
    """Hooks on `manager` (through `scheduler`'s SchedulerHooks when it is the scheduler's
    own), or the reason they refuse it, or the error that stopped them attaching."""
    try:
        hooks = KVCacheHooks(
            manager,
            CountingBuffer(),
            pseudonymizer=PSEUDONYMIZER,
            record_token_ids=True,
            check_collisions=True,
        )
        on_failure = functools.partial(_on_failure, hooks)
        if scheduler is None:
            hooks.on_failure = on_failure
            hooks.attach()
        else:
            scheduler_hooks = SchedulerHooks(scheduler, hooks, _tenant)
            scheduler_hooks.on_failure = on_failure
            scheduler_hooks.attach()
            TALLY.hooked_by_scheduler += 1
    except UnsupportedCacheLayout as refusal:
        TALLY.refused[_reason(refusal)] += 1
        return
    except Exception as error:  # never into vLLM's test: counted, and the test asserts on it
        TALLY.attach_errors[f"{type(error).__name__}: {_reason(error)}"] += 1
        return
    TALLY.hooked += 1
    TALLY.tests_hooked.add(_test)


def _wrap_manager_init(original: Any) -> Any:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if _building:
            _building[-1].append(self)  # the scheduler being built hooks it
        else:
            _attach(self)

    return __init__


def _wrap_scheduler_init(original: Any) -> Any:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _building.append([])
        try:
            original(self, *args, **kwargs)
        finally:
            built = _building.pop()
        own = getattr(self, "kv_cache_manager", None)
        for manager in built:
            _attach(manager, self if manager is own else None)

    return __init__


def pytest_configure(config: pytest.Config) -> None:
    from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.v1.core.sched.scheduler import Scheduler  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    KVCacheManager.__init__ = _wrap_manager_init(KVCacheManager.__init__)  # type: ignore[method-assign]
    Scheduler.__init__ = _wrap_scheduler_init(Scheduler.__init__)  # type: ignore[method-assign]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    global _test  # noqa: PLW0603 - the one test running in this session
    _test = item.nodeid
    try:
        return (yield)
    finally:
        _test = "(outside a test)"
        _count_failures()


def pytest_sessionfinish(session: pytest.Session) -> None:
    _count_failures()
    path = os.environ.get(COUNTS_ENV)
    if path:
        Path(path).write_text(json.dumps(TALLY.as_json(), indent=1) + "\n")
