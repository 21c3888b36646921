"""The one KV cache layout the hooks can mirror exactly, and the check for it."""

from __future__ import annotations

from typing import Any


class UnsupportedCacheLayout(RuntimeError):
    """The manager is not one the hooks can mirror exactly (e.g. several KV cache groups)."""


def check_layout(manager: Any) -> None:
    """kvscope mirrors one full-attention KV cache group hashed at its own block size.

    That layout is what makes the hooks' fast paths exact: vLLM then never puts a null block
    in a request's table, never masks a block out of caching, and never registers partial
    (sub-block) hashes, so every block from `num_cached_blocks` to `num_full_blocks` that
    `cache_full_blocks` sees is stored, and every block freed is a real pool block.
    """
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    groups = manager.kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        raise UnsupportedCacheLayout(
            f"kvscope mirrors one KV cache group, this manager has {len(groups)}"
        )
    spec = groups[0].kv_cache_spec
    if not isinstance(spec, FullAttentionSpec):
        raise UnsupportedCacheLayout(
            f"kvscope mirrors full attention, this manager's group is {type(spec).__name__}"
        )
    if manager.block_pool.hash_block_size != spec.block_size:
        raise UnsupportedCacheLayout(
            f"kvscope mirrors hashing at the block size ({spec.block_size}), this manager "
            f"hashes every {manager.block_pool.hash_block_size} tokens"
        )
