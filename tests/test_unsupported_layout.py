"""A KV cache layout the hooks cannot mirror exactly is refused, never half-recorded."""

from __future__ import annotations

import pytest
import torch
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
)

from engine_hooks import UnsupportedCacheLayout
from tests.support.block_manager import make_hooks

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version


def test_a_mamba_group_is_refused() -> None:
    """vLLM copies, moves and drops a Mamba group's cached hashes outside the pool methods
    the hooks see: kvscope says so rather than record a stream that is wrong."""
    full = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float16)
    mamba = MambaSpec(
        block_size=16, shapes=((1,),), dtypes=(torch.float16,), mamba_cache_mode="align"
    )
    config = KVCacheConfig(
        num_blocks=32,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["l0"], full), KVCacheGroupSpec(["l1"], mamba)],
    )
    manager = KVCacheManager(
        config, max_model_len=1024, scheduler_block_size=16, hash_block_size=16
    )
    with pytest.raises(UnsupportedCacheLayout, match=r"group 1 is MambaSpec \(MambaManager\)"):
        make_hooks(manager)
    assert manager.allocate_slots.__self__ is manager, "nothing was attached"
    single = manager.coordinator.single_type_managers[0]
    assert single.allocate_new_blocks.__self__ is single
