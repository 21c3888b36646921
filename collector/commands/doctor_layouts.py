"""The KV cache layouts the doctor tries (doctor_checks.py): the trial on each layout kvscope
mirrors, and each layout it refuses built in this vLLM and put to the hooks' own check
(`engine_hooks.layout.check_layout`), with the reason."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from collector.commands.doctor_check import FAIL, OK, REPORT, WARN, Check
from collector.commands.doctor_trial import (
    BLOCK_SIZE,
    NUM_BLOCKS,
    attempt,
    disagreements,
    record_counts,
)
from collector.replay.block_manager import MAX_MODEL_LEN, CacheSettings, make_kv_cache_manager
from collector.replay.kv_layout import PRESETS
from engine_hooks.layout import MANAGER_KINDS, UnsupportedCacheLayout, check_layout

REFUSED_FIX = (
    "an engine with such a layout runs uncaptured (the plugin logs one line); read vLLM's own "
    "KV events from it instead: `kvscope collect --db RUN.duckdb --vllm-kv-events ENDPOINT`"
)


def _attention(block_size: int = BLOCK_SIZE) -> Any:
    import torch  # noqa: PLC0415 - torch takes seconds to load; only what drives vLLM pays
    from vllm.v1.kv_cache_interface import FullAttentionSpec  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    return FullAttentionSpec(block_size, num_kv_heads=1, head_size=1, dtype=torch.float16)


def _mamba(num_speculative_blocks: int = 0) -> Any:
    import torch  # noqa: PLC0415 - torch takes seconds to load; only what drives vLLM pays
    from vllm.v1.kv_cache_interface import MambaSpec  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    return MambaSpec(
        block_size=BLOCK_SIZE,
        shapes=((4, 16),),
        dtypes=(torch.float16,),
        mamba_cache_mode="align",  # how vLLM caches a Mamba group's states by prefix
        num_speculative_blocks=num_speculative_blocks,
    )


def _manager(
    specs: list[Any],
    *,
    scheduler_block_size: int = BLOCK_SIZE,
    hash_block_size: int = BLOCK_SIZE,
    dcp_world_size: int = 1,
    group_options: Mapping[str, Any] | None = None,
    **config: Any,
) -> Any:
    """vLLM's `KVCacheManager` for these groups' specs, as the scheduler builds one."""
    from vllm.config import CacheConfig  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    groups = [
        KVCacheGroupSpec([f"model.layers.{index}"], spec, **(group_options or {}))
        for index, spec in enumerate(specs)
    ]
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=groups,
        prefix_cache_retention_interval=CacheConfig().prefix_cache_retention_interval,
        **config,
    )
    return KVCacheManager(
        kv_cache_config,
        max_model_len=MAX_MODEL_LEN,
        scheduler_block_size=scheduler_block_size,
        hash_block_size=hash_block_size,
        enable_caching=True,
        log_stats=True,
        enable_kv_cache_events=True,
        dcp_world_size=dcp_world_size,
    )


def _mirrored_layouts() -> list[tuple[str, str, Callable[[], Any]]]:
    """Each layout kvscope replays and mirrors: its name, its groups, and its manager."""

    def preset(name: str) -> Callable[[], Any]:
        settings = CacheSettings(block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS, kv_layout=name)
        return lambda: make_kv_cache_manager(settings, kv_events=True)

    layouts = [(name, _groups(PRESETS[name]), preset(name)) for name in PRESETS]
    layouts.append(("mamba", _groups("full,mamba"), lambda: _manager([_attention(), _mamba()])))
    return layouts


def _groups(layout: str) -> str:
    """A layout's groups, counted: "full + 5 sliding_window:1024"."""
    counts = Counter(layout.split(","))
    return " + ".join(f"{count} {group}" if count > 1 else group for group, count in counts.items())


def layout_checks(capture_works: bool) -> list[Check]:
    """The capture trial on each layout kvscope mirrors (after it passed on the plainest)."""
    if not capture_works:
        return [Check(FAIL, "layouts", "not tried: capture fails on the plainest layout", REPORT)]
    checks = []
    for name, groups, build in _mirrored_layouts():
        trial = attempt(build, True)
        problems = [trial] if isinstance(trial, str) else disagreements(trial)
        if problems:
            reason = f"{name} ({groups}): " + "; ".join(problems)
            checks.append(Check(FAIL, "layout", reason, REPORT))
            continue
        assert not isinstance(trial, str)
        counts = record_counts(trial)
        checks.append(
            Check(
                OK,
                "layout",
                f"{name} ({groups}): mirrored, {counts['hit']} blocks hit and "
                f"{counts['store']} stored as vLLM counts them",
            )
        )
    return checks


HASH_WHY = (
    "vLLM keys the block a prompt ends in by a partial hash, and again once the block is "
    "full; kvscope records one hash per whole block, and its mirror would need the partial ones"
)
HISPARSE_WHY = (
    "its blocks come from a private host pool (HiSparseSourceManager.bind_host_pool) the "
    "hooks never wrap, and their hashes are published when the worker reports a host copy "
    "durable, even after the request is freed (HiSparseCoordinator.publish_when_ready), in "
    "no call the hooks follow"
)
CROSS_WHY = (
    "its encoder states belong to one request and are never prefix-cached "
    "(CrossAttentionManager); kvscope refuses the whole engine"
)
SPECULATIVE_WHY = (
    "vLLM moves the speculative states within the request's block table, in no call to the "
    "pool the hooks could see"
)
PARTIAL_WHY = "a hit may end inside a block; kvscope's records and mirror count whole blocks"


def _hisparse_source() -> Any:
    from vllm.v1.kv_cache_interface import KVCacheGroupRole  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    options = {"role": KVCacheGroupRole.HISPARSE_SOURCE, "host_resident": True}
    return _manager([_attention()], group_options=options, hisparse_host_num_blocks=NUM_BLOCKS)


def _cross_attention() -> Any:
    import torch  # noqa: PLC0415 - torch takes seconds to load; only what drives vLLM pays
    from vllm.v1.kv_cache_interface import CrossAttentionSpec  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    spec = CrossAttentionSpec(BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float16)
    return _manager([_attention(), spec])


def _refused_layouts() -> list[tuple[str, Callable[[], Any], str]]:
    """The layouts vLLM serves and kvscope refuses: what is built, its manager, and why."""
    import torch  # noqa: PLC0415 - torch takes seconds to load; only what drives vLLM pays
    from vllm.v1.kv_cache_interface import SlidingWindowSpec  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    window = SlidingWindowSpec(
        2 * BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float16, sliding_window=128
    )
    return [
        (
            "a hash block smaller than a block (16-token attention beside 32-token window "
            "blocks, hashed every 16 tokens: the groups' GCD, or --prefix-match-unit)",
            lambda: _manager([_attention(), window], scheduler_block_size=2 * BLOCK_SIZE),
            HASH_WHY,
        ),
        ("HiSparse's host source group", _hisparse_source, HISPARSE_WHY),
        ("cross-attention (encoder-decoder models)", _cross_attention, CROSS_WHY),
        (
            "Mamba with speculative (MTP) blocks",
            lambda: _manager([_attention(), _mamba(num_speculative_blocks=1)]),
            SPECULATIVE_WHY,
        ),
        (
            "partial-block hits (vLLM's fine-grained hits beside a Mamba group in 'align' "
            "mode, here with decode context parallelism 2)",
            lambda: _manager(
                [_attention(), _mamba()], scheduler_block_size=2 * BLOCK_SIZE, dcp_world_size=2
            ),
            PARTIAL_WHY,
        ),
    ]


def refused_layout_checks() -> list[Check]:
    """Each layout kvscope refuses, built in this vLLM and put to the hooks' own check."""
    checks = []
    try:
        refused = _refused_layouts()
    except Exception as error:  # a vLLM without these specs
        refused = []
        checks.append(Check(WARN, "refuses", f"not built here: {type(error).__name__}: {error}"))
    named = set(MANAGER_KINDS)
    for what, build, why in refused:
        try:
            manager = build()
        except Exception as error:
            checks.append(
                Check(
                    WARN,
                    "refuses",
                    f"{what}: not built in this vLLM ({type(error).__name__}: {error})",
                )
            )
            continue
        named.update(type(single).__name__ for single in manager.coordinator.single_type_managers)
        try:
            layout = check_layout(manager)
        except UnsupportedCacheLayout as error:
            checks.append(Check(WARN, "refuses", f"{what}: {why}", REFUSED_FIX, str(error)))
            continue
        checks.append(
            Check(
                FAIL,
                "refuses",
                f"{what}: the hooks' check accepted it ({len(layout.groups)} groups), which "
                f"they cannot mirror: {why}",
                REPORT,
            )
        )
    others = sorted(set(_vllm_manager_kinds()) - named)
    if others:
        checks.append(
            Check(
                WARN,
                "refuses",
                f"vLLM's other group managers: {', '.join(others)} (the hooks mirror "
                f"{', '.join(MANAGER_KINDS)})",
                REFUSED_FIX,
            )
        )
    return checks


def _vllm_manager_kinds() -> list[str]:
    """The group managers this vLLM has (`SingleTypeKVCacheManager`'s subclasses)."""
    from vllm.v1.core import single_type_kv_cache_manager as module  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    base = module.SingleTypeKVCacheManager
    return [
        name
        for name, value in vars(module).items()
        if isinstance(value, type)
        and issubclass(value, base)
        and value is not base
        and not name.startswith("_")
        and value.__module__ == module.__name__
    ]
