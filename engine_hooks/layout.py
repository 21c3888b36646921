"""The KV cache layouts the hooks can mirror exactly, and the check for them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class UnsupportedCacheLayout(RuntimeError):
    """The manager is not one the hooks can mirror exactly (e.g. partial-block hashes)."""


# vLLM's manager class of each group kind the hooks mirror, by the kind's name in kvscope.
# MLA groups are full attention to the block manager (`FullAttentionManager`).
MANAGER_KINDS = {
    "FullAttentionManager": "full",
    "SlidingWindowManager": "sliding_window",
    "ChunkedLocalAttentionManager": "chunked_local",
    "MambaManager": "mamba",
}


@dataclass(frozen=True)
class KvGroup:
    """One KV cache group: what kind of attention its layers use, its block size, and the
    tokens each layer reads back (the sliding window or the local chunk; 0 for full)."""

    kind: str
    block_size: int
    window: int = 0
    num_layers: int = 1


@dataclass(frozen=True)
class CacheLayout:
    """A manager's KV cache groups, in vLLM's group order (a record's `kv_group` indexes it)."""

    groups: tuple[KvGroup, ...]

    @property
    def block_size(self) -> int:
        return self.groups[0].block_size

    @property
    def dense(self) -> bool:
        """One full-attention group: every prefix hit starts at block 0, every block vLLM
        tracks is a real pool block, and every full block is stored. The hooks' fast paths
        rely on it; other layouts take the sparse ones (null blocks, masks, groups)."""
        return len(self.groups) == 1 and self.groups[0].kind == "full"


def check_layout(manager: Any) -> CacheLayout:
    """The manager's layout, if kvscope mirrors it exactly; `UnsupportedCacheLayout` if not.

    Every group must be full attention (MLA included), sliding window, chunked local
    attention or Mamba, hashed at its own block size (so vLLM registers no partial-block
    hashes), and cached by prefix. A Mamba group is cached in vLLM's "align" mode (one state
    block per block boundary it keeps), without speculative blocks.
    """
    coordinator = manager.coordinator
    hash_block_size = manager.block_pool.hash_block_size
    groups = []
    for index, (group, single) in enumerate(
        zip(manager.kv_cache_config.kv_cache_groups, coordinator.single_type_managers, strict=True)
    ):
        spec = group.kv_cache_spec
        kind = MANAGER_KINDS.get(type(single).__name__)
        if kind is None:
            raise UnsupportedCacheLayout(
                f"kvscope mirrors full-attention, sliding-window, chunked-local and Mamba groups; "
                f"group {index} is {type(spec).__name__} ({type(single).__name__})"
            )
        if spec.block_size != hash_block_size:
            raise UnsupportedCacheLayout(
                f"kvscope mirrors groups hashed at their block size; group {index} has "
                f"{spec.block_size}-token blocks, hashed every {hash_block_size} tokens"
            )
        if not getattr(spec, "prefix_cacheable", True):
            raise UnsupportedCacheLayout(f"group {index} ({type(spec).__name__}) is not cached")
        # A Mamba group's states are hashed through `cache_full_blocks` and
        # `cache_partial_block`, both hooked. vLLM drops a transient prefill checkpoint with
        # `_maybe_evict_cached_block`, unhooked: the tests see it only on blocks not yet keyed
        # (were one keyed, the collector would count its eviction when vLLM hands the block
        # out again). Speculative (MTP) blocks, which the Mamba manager relocates in the block
        # table itself, are refused.
        if kind == "mamba" and spec.num_speculative_blocks:
            raise UnsupportedCacheLayout(
                f"group {index} (MambaSpec): kvscope does not mirror speculative blocks"
            )
        window = {"sliding_window": "sliding_window", "chunked_local": "attention_chunk_size"}
        tokens = int(getattr(spec, window[kind])) if kind in window else 0
        groups.append(KvGroup(kind, spec.block_size, tokens, len(group.layer_names)))
    if getattr(coordinator, "enable_partial_hash_hits", False):
        raise UnsupportedCacheLayout("kvscope does not mirror partial-block prefix hits")
    return CacheLayout(tuple(groups))
