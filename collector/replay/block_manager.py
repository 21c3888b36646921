"""Builds vLLM's real v1 `KVCacheManager` on the CPU, and the requests it manages."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from collector.replay.kv_layout import check_fits, parse_layout
from collector.unavailable import Unavailable
from engine_hooks.versions import is_supported, supported_versions

if TYPE_CHECKING:  # vLLM is imported where it runs, so `kvscope` starts without it
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import BlockHash
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

    BlockHasher = Callable[[Request], list[BlockHash]]

HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
MAX_MODEL_LEN = 1 << 22


@dataclass(frozen=True)
class CacheSettings:
    """The prefix-cache settings a replay or a what-if varies."""

    block_size: int = 16
    num_blocks: int = 20_000
    hash_algo: str = "sha256"
    kv_layout: str = "full"  # a preset or groups spelled out (collector/replay/kv_layout.py)

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError(f"block size must be positive, got {self.block_size}")
        if self.num_blocks < 2:
            raise ValueError(
                f"need at least 2 blocks (one is vLLM's null block), got {self.num_blocks}"
            )
        if self.hash_algo not in HASH_ALGOS:
            raise ValueError(f"unknown hash algorithm {self.hash_algo!r}; use one of {HASH_ALGOS}")
        check_fits(parse_layout(self.kv_layout), self.block_size)


def make_kv_cache_manager(
    settings: CacheSettings, log_stats: bool = True, kv_events: bool = False
) -> KVCacheManager:
    """A `KVCacheManager` with the settings' KV cache groups (one full-attention group by
    default), as the scheduler would build it: several groups get vLLM's hybrid coordinator.

    `kv_events` turns on vLLM's own KV cache events (BlockStored, BlockRemoved, ...).
    """
    from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    return KVCacheManager(
        kv_cache_config(settings),
        max_model_len=MAX_MODEL_LEN,
        scheduler_block_size=settings.block_size,
        hash_block_size=settings.block_size,
        enable_caching=True,
        log_stats=log_stats,
        enable_kv_cache_events=kv_events,
    )


def cached_prefix_blocks(manager: KVCacheManager, block_hashes: Sequence[BlockHash]) -> int:
    """How many of `block_hashes`, from the first, `manager`'s prefix cache holds right now,
    read from its block pool hash by hash to the first miss (`BlockPool.get_cached_block`:
    unlike `get_computed_blocks`, it counts no prefix-cache query)."""
    group_ids = list(range(manager.num_kv_cache_groups))
    for count, block_hash in enumerate(block_hashes):
        if manager.block_pool.get_cached_block(block_hash, group_ids) is None:
            return count
    return len(block_hashes)


def kv_cache_config(settings: CacheSettings) -> KVCacheConfig:
    """vLLM's `KVCacheConfig` of the settings: their pool and KV cache groups (a tiny spec per
    group: what a block holds does not matter to the manager, only how many there are)."""
    quiet_torch_imports()
    import torch  # noqa: PLC0415 - torch takes seconds to load; only what drives vLLM pays
    from vllm.config import CacheConfig  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.v1.kv_cache_interface import (  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        KVCacheSpec,
        SlidingWindowSpec,
    )

    block_size = settings.block_size
    groups = []
    for index, (kind, tokens) in enumerate(parse_layout(settings.kv_layout)):
        spec: KVCacheSpec
        if kind == "sliding_window":
            spec = SlidingWindowSpec(
                block_size, num_kv_heads=1, head_size=1, dtype=torch.float16, sliding_window=tokens
            )
        elif kind == "chunked_local":
            spec = ChunkedLocalAttentionSpec(
                block_size,
                num_kv_heads=1,
                head_size=1,
                dtype=torch.float16,
                attention_chunk_size=tokens,
            )
        else:
            spec = FullAttentionSpec(block_size, num_kv_heads=1, head_size=1, dtype=torch.float16)
        groups.append(KVCacheGroupSpec([f"model.layers.{index}.self_attn"], spec))
    config = KVCacheConfig(
        num_blocks=settings.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=groups,
        # As vLLM's engine plans it, with its default: window and Mamba groups keep states
        # only where a later request can resume.
        prefix_cache_retention_interval=CacheConfig().prefix_cache_retention_interval,
    )
    return config


def kv_groups(settings: CacheSettings) -> list[dict[str, object]]:
    """The settings' KV cache groups as a run file's options keep them (as the hooks in an
    engine describe its groups: `engine_hooks.layout.KvGroup`)."""
    return [
        {"kind": kind, "block_size": settings.block_size, "window": tokens, "num_layers": 1}
        for kind, tokens in parse_layout(settings.kv_layout)
    ]


def make_block_hasher(settings: CacheSettings) -> BlockHasher:
    """vLLM's request block hasher for these settings (initialises vLLM's NONE_HASH)."""
    from vllm.utils.hashing import get_hash_fn_by_name  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    hash_fn = get_hash_fn_by_name(settings.hash_algo)
    init_none_hash(hash_fn)
    return get_request_block_hasher(settings.block_size, hash_fn)


def make_request(
    request_id: str,
    token_ids: list[int],
    block_hasher: BlockHasher,
    *,
    max_tokens: int = 1,
    arrival_time: float = 0.0,
    lora_name: str | None = None,
    cache_salt: str | None = None,
) -> Request:
    """A vLLM `Request` whose block hashes vLLM computes itself on creation."""
    from vllm.sampling_params import SamplingParams  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.v1.request import Request  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    lora_request = None
    if lora_name is not None:
        from vllm.lora.request import LoRARequest  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

        lora_request = LoRARequest(lora_name, _lora_int_id(lora_name), f"/adapters/{lora_name}")
    return Request(
        request_id,
        token_ids,
        SamplingParams(max_tokens=max(max_tokens, 1)),
        None,
        arrival_time=arrival_time,
        lora_request=lora_request,
        cache_salt=cache_salt,
        block_hasher=block_hasher,
    )


def _lora_int_id(name: str) -> int:
    """A stable positive id for an adapter name (vLLM wants an int id per adapter)."""
    return zlib.crc32(name.encode()) % (1 << 30) + 1


class VllmUnavailable(Unavailable):
    """This environment has no vLLM kvscope supports, and the command replays through it."""


# Loggers that warn, on import, of what a replay never uses: torch of its own deprecations and
# of a CUDA runtime; vLLM's platforms of the compiled kernels this build lacks ("Failed to
# import from vllm._C", which reads like an error). Noise to a kvscope user.
_IMPORT_NOISE = (
    "torch._opaque_base",
    "torch._library.opaque_object",
    "torch.utils.cpp_extension",
    "vllm.platforms",
)


def quiet_torch_imports() -> None:
    """Keep those warnings off the terminal (errors still show). Only kvscope's own commands
    call it, in their own process: the plugin inside a user's engine never does (it imports
    nothing of collector/), so vLLM's logging there is the user's."""
    for name in _IMPORT_NOISE:
        logging.getLogger(name).setLevel(logging.ERROR)


def require_vllm() -> str:
    """The version of this environment's vLLM; `VllmUnavailable` when it has no supported one."""
    quiet_torch_imports()

    wanted = (
        f"replays run requests through vLLM's own block manager and need vLLM "
        f"{supported_versions()} in this Python environment: install kvscope into your "
        "vLLM environment, or `pip install 'kvscope[vllm]'`"
    )
    try:
        import vllm  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    except ImportError as error:
        raise VllmUnavailable(f"{wanted} ({error})") from None
    version = str(vllm.__version__)
    if not is_supported(version):
        raise VllmUnavailable(f"{wanted} (this one has vLLM {version})")
    return version
