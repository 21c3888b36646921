"""Blocks <-> GiB for a model's KV spec, and the vLLM settings that size a pool."""

from __future__ import annotations

import pytest

from collector.model.kv_memory import (
    MODELS,
    GpuMemory,
    KVSpec,
    blocks_for_gib,
    gib_for_blocks,
    vllm_pool_settings,
)


def test_llama_8b_block_of_16_tokens_takes_two_mib() -> None:
    spec = MODELS["llama-3.1-8b"]
    # 2 (K and V) x 32 layers x 8 KV heads x 128 head size x 2 bytes = 128 KiB per token.
    assert spec.bytes_per_token() == 131_072
    assert spec.bytes_per_block(16) == 2 * 1024 * 1024
    assert blocks_for_gib(spec, 16, 8) == 4_096
    assert gib_for_blocks(spec, 16, 4_096) == 8.0
    assert blocks_for_gib(spec, 32, 8) == 2_048


def test_tensor_parallel_splits_kv_heads_but_never_below_one() -> None:
    spec = KVSpec("m", num_layers=2, num_kv_heads=8, head_size=64, dtype="fp8")
    assert KVSpec("m", 2, 8, 64, "fp8", tensor_parallel_size=4).bytes_per_token() == (
        spec.bytes_per_token() // 4
    )
    assert KVSpec("m", 2, 8, 64, "fp8", tensor_parallel_size=16).bytes_per_token() == 2 * 2 * 64


def test_pool_settings_give_blocks_and_the_matching_memory_share() -> None:
    spec = MODELS["llama-3.1-8b"]
    current_gib = gib_for_blocks(spec, 16, 4_000)
    settings = vllm_pool_settings(spec, 16, 8_096, current_gib, GpuMemory(80, 0.9))
    # 4,096 more blocks of 2 MiB = 8 GiB = 0.1 of an 80 GiB GPU.
    assert settings == ["--gpu-memory-utilization 1.000", "--num-gpu-blocks-override 8096"]
    # 50,000 blocks take 97.7 GiB; the GPU gives the KV cache at most 7.8 + 8 GiB; fp8 and
    # tensor parallel 2 halve it, not enough.
    too_much = vllm_pool_settings(spec, 16, 50_000, current_gib, GpuMemory(80, 0.9))
    assert too_much == [
        "(no --gpu-memory-utilization holds it: 50,000 blocks take 97.7 GiB per GPU, and this "
        "80 GiB GPU can give the KV cache 15.8 GiB at most; it needs a larger GPU)",
        "--num-gpu-blocks-override 50000",
    ]
    # 12,000 blocks (23.4 GiB) fit in fp8 (11.7 GiB) or split over 2 GPUs.
    other_knobs = vllm_pool_settings(spec, 16, 12_000, current_gib, GpuMemory(80, 0.9))
    assert other_knobs[0] == (
        "(no --gpu-memory-utilization holds it: 12,000 blocks take 23.4 GiB per GPU, and this "
        "80 GiB GPU can give the KV cache 15.8 GiB at most; --kv-cache-dtype fp8 takes it to "
        "11.7 GiB; --tensor-parallel-size 2 takes it to 11.7 GiB per GPU)"
    )
    assert vllm_pool_settings(spec, 16, 8_096, current_gib) == ["--num-gpu-blocks-override 8096"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_layers": 0}, "num_layers must be at least 1"),
        ({"dtype": "int3"}, "unknown KV dtype"),
    ],
)
def test_bad_specs_are_refused(fields: dict[str, object], message: str) -> None:
    values: dict[str, object] = {"name": "m", "num_layers": 2, "num_kv_heads": 2, "head_size": 8}
    values.update(fields)
    with pytest.raises(ValueError, match=message):
        KVSpec(**values)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="utilization"):
        GpuMemory(80, 1.5)
