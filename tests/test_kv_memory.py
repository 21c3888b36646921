"""Blocks <-> GiB for a model's KV spec, and the vLLM settings that size a pool."""

from __future__ import annotations

from dataclasses import replace

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


def test_pool_settings_offer_fp8_and_check_max_model_len() -> None:
    spec = MODELS["llama-3.1-8b"]
    current_gib = gib_for_blocks(spec, 16, 4_000)  # 7.8 GiB
    # 7,000 blocks: 5.9 GiB more (0.073 of 80 GiB), or fp8 in the same 7.8 GiB (8,000 blocks).
    assert vllm_pool_settings(spec, 16, 7_000, current_gib, GpuMemory(80, 0.9)) == [
        "--gpu-memory-utilization 0.973",
        "--num-gpu-blocks-override 7000",
        "(or, in today's memory: --kv-cache-dtype fp8 holds 8,000 blocks there, at some risk "
        "to accuracy)",
    ]
    # A smaller pool needs no other knob; an fp8 cache has none to offer.
    assert vllm_pool_settings(spec, 16, 3_000, current_gib) == ["--num-gpu-blocks-override 3000"]
    fp8 = replace(spec, dtype="fp8")
    fp8_gib = gib_for_blocks(fp8, 16, 4_000)
    assert vllm_pool_settings(fp8, 16, 7_000, fp8_gib) == ["--num-gpu-blocks-override 7000"]
    # 3,000 blocks of 16 tokens hold 48,000 tokens: not one request of Llama's 131,072.
    assert vllm_pool_settings(spec, 16, 3_000, current_gib, max_model_len=131_072)[1] == (
        "(too small for --max-model-len 131,072: vLLM refuses to start with a pool of fewer "
        "than 8,192 blocks; lower --max-model-len to 48,000 or less)"
    )
    assert vllm_pool_settings(spec, 16, 8_192, current_gib, max_model_len=131_072) == [
        "--num-gpu-blocks-override 8192"
    ]


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
