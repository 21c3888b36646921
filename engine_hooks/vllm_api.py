"""What kvscope relies on in vLLM, and everything of it that differs between the versions
kvscope supports (engine_hooks/versions.py): the one module that knows.

The hooks and the replays call the helpers below and never read `vllm.__version__`. Each
helper meets a difference by what vLLM offers, not by its version number:

- A request resumed after a preemption: 0.32 and 0.33 list its id in the `SchedulerOutput`'s
  `scheduled_cached_reqs.resumed_req_ids`; 0.34 sends it again in full among
  `scheduled_new_reqs` (`resumed_request_ids`).
- `ModelRunnerOutput(req_id_to_index=...)`: required up to 0.33, removed in 0.34
  (`model_runner_output`).
- `BlockPool.free_blocks(ordered_blocks)` takes `evict_first=False` from 0.34 (the CPU
  offload connectors pass it): the hooks pass every argument on as given.
- `KVCacheManager.get_num_cached_tokens` (0.34): a probe of the cache that takes no
  references and counts no query; the waiting queue's cache-aware reordering calls it. It is
  not hooked, so kvscope does not count it as a lookup.
- `Request.skip_reading_prefix_cache` (up to 0.33) became `prefix_cache_hit_limit` (0.34):
  the hooks ask the manager's own `prefix_cache_lookup_enabled`, in every version.
- A request's token ids: a list up to 0.33; 0.34 keeps them in an int32 `array`
  (`TokenBuffer`, behind `Request.all_token_ids`), whose spans the fingerprints copy as bytes
  without making an int per token (`token_span`; earlier versions' lists are packed alike).

`contract_problems()` checks, at attach time, that vLLM still has every method the hooks
wrap with the arguments they read: the plugin refuses to capture, in one log line naming
what is missing, when it does not (a release that renamed one would otherwise break capture,
or the engine).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Method:
    """A method of vLLM's that kvscope wraps or calls, with the parameters it passes or reads
    by name."""

    module: str
    owner: str
    name: str
    parameters: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f"{self.owner}.{self.name}"


_MANAGER = "vllm.v1.core.kv_cache_manager"
_POOL = "vllm.v1.core.block_pool"
_SINGLE = "vllm.v1.core.single_type_kv_cache_manager"
_SCHEDULER = "vllm.v1.core.sched.scheduler"

# What the hooks (engine_hooks/hooks.py, pool_hooks.py, scheduler_hooks.py) wrap or call.
CONTRACT = (
    Method(_MANAGER, "KVCacheManager", "allocate_slots", ("request", "num_new_tokens")),
    Method(_MANAGER, "KVCacheManager", "free", ("request",)),
    Method(_MANAGER, "KVCacheManager", "record_prefix_cache_stats", ("request", "num_hits")),
    Method(_MANAGER, "KVCacheManager", "prefix_cache_lookup_enabled", ("request",)),
    Method(_POOL, "BlockPool", "get_new_blocks", ("num_blocks",)),
    Method(_POOL, "BlockPool", "touch", ("blocks",)),
    Method(
        _POOL,
        "BlockPool",
        "cache_full_blocks",
        (
            "request",
            "blocks",
            "num_cached_blocks",
            "num_full_blocks",
            "block_size",
            "kv_cache_group_id",
        ),
    ),
    Method(
        _POOL,
        "BlockPool",
        "cache_partial_block",
        ("request", "block", "num_tokens", "kv_cache_group_id"),
    ),
    Method(_POOL, "BlockPool", "free_blocks", ("ordered_blocks",)),
    Method(_POOL, "BlockPool", "evict_blocks", ("block_ids",)),
    Method(_POOL, "BlockPool", "reset_prefix_cache"),
    Method(_POOL, "BlockPool", "get_num_free_blocks"),
    Method(
        _SINGLE,
        "SingleTypeKVCacheManager",
        "add_local_computed_blocks",
        ("request_id", "new_computed_blocks"),
    ),
    Method(_SINGLE, "SingleTypeKVCacheManager", "allocate_new_blocks"),
    Method(_SINGLE, "SingleTypeKVCacheManager", "allocate_external_computed_blocks"),
    Method(_SCHEDULER, "Scheduler", "add_request", ("request",)),
    Method(_SCHEDULER, "Scheduler", "schedule"),
    Method(_SCHEDULER, "Scheduler", "update_from_output", ("scheduler_output",)),
    Method(_SCHEDULER, "Scheduler", "_preempt_request", ("request",)),
    Method(_SCHEDULER, "Scheduler", "_free_request", ("request",)),
)

# The fields of vLLM's records the hooks read.
FIELDS = (
    (
        "vllm.v1.core.sched.output",
        "SchedulerOutput",
        ("scheduled_new_reqs", "scheduled_cached_reqs", "num_scheduled_tokens"),
    ),
    ("vllm.v1.core.sched.output", "NewRequestData", ("req_id",)),
    ("vllm.v1.core.kv_cache_utils", "KVCacheBlock", ("block_id", "ref_cnt")),
)


def contract_problems() -> list[str]:
    """What the hooks rely on and this vLLM lacks, one line each; [] when capture can attach."""
    problems = []
    for method in CONTRACT:
        try:
            owner = getattr(importlib.import_module(method.module), method.owner)
        except (ImportError, AttributeError) as error:
            problems.append(f"{method.module}.{method.owner} cannot be imported ({error})")
            continue
        function = getattr(owner, method.name, None)
        if not callable(function):
            problems.append(f"{method.where} is missing")
            continue
        try:
            names = set(inspect.signature(function).parameters)
        except (TypeError, ValueError):  # a builtin without a signature: nothing to check
            continue
        missing = [name for name in method.parameters if name not in names]
        if missing:
            problems.append(f"{method.where} has no parameter {', '.join(missing)}")
    for module, name, fields in FIELDS:
        try:
            owner = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as error:
            problems.append(f"{module}.{name} cannot be imported ({error})")
            continue
        known = _field_names(owner)
        missing = [field for field in fields if field not in known]
        if missing:
            problems.append(f"{name} has no field {', '.join(missing)}")
    return problems


def _field_names(owner: type) -> set[str]:
    """A record class's fields (vLLM's are dataclasses); its attributes if it is not one."""
    if dataclasses.is_dataclass(owner):
        return {field.name for field in dataclasses.fields(owner)}
    return set(dir(owner))


def resumed_request_ids(output: Any) -> Iterable[str]:
    """The requests a `SchedulerOutput` resumes after a preemption that are not among its
    `scheduled_new_reqs` (vLLM 0.34 sends resumed requests there, in full)."""
    return getattr(output.scheduled_cached_reqs, "resumed_req_ids", ())


def model_runner_output(request_ids: list[str], **fields: Any) -> Any:
    """vLLM's `ModelRunnerOutput` for these requests, in the form this vLLM takes."""
    from vllm.v1.outputs import ModelRunnerOutput  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    if "req_id_to_index" in {field.name for field in dataclasses.fields(ModelRunnerOutput)}:
        fields["req_id_to_index"] = {request_id: i for i, request_id in enumerate(request_ids)}
    return ModelRunnerOutput(req_ids=request_ids, **fields)


def token_span(request: Any, start: int, end: int) -> array[int]:
    """The request's token ids from `start` to `end` as int32: a slice of vLLM's own int32
    array where it keeps one (0.34), else packed from its list (as 0.34 would hold them, so
    every version gives the same bytes)."""
    tokens = getattr(request, "_all_token_ids", None)
    if isinstance(tokens, array) and tokens.typecode == "i":
        return array.__getitem__(tokens, slice(start, end))
    return array("i", request.all_token_ids[start:end])
