"""A KV cache layout the hooks cannot mirror exactly is refused, never half-recorded."""

from __future__ import annotations

import pytest
import torch
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

from engine_hooks import UnsupportedCacheLayout
from tests.support.block_manager import make_hooks

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version


def test_a_sliding_window_group_is_refused() -> None:
    spec = SlidingWindowSpec(
        block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float16, sliding_window=64
    )
    config = KVCacheConfig(
        num_blocks=32, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)]
    )
    manager = KVCacheManager(
        config, max_model_len=1024, scheduler_block_size=16, hash_block_size=16
    )
    with pytest.raises(UnsupportedCacheLayout, match=r"full attention, .* SlidingWindowSpec"):
        make_hooks(manager)
    assert manager.allocate_slots.__self__ is manager, "nothing was attached"
