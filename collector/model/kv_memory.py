"""KV cache blocks <-> GPU memory for a model's KV spec, and the vLLM settings that size a pool.

A full-attention block holds keys and values for `block_size` tokens in every layer:
2 * block_size * num_kv_heads * head_size * dtype bytes per layer (vLLM's
`FullAttentionSpec.page_size_bytes`), times the layers. With tensor parallelism each GPU
holds its share of the KV heads (at least one), and every GPU holds the same number of
blocks: `--num-gpu-blocks-override` counts blocks per GPU, vLLM's null block included.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

GIB = 1 << 30
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


@dataclass(frozen=True)
class KVSpec:
    """What sizes a model's KV cache: layers, KV heads, head size, KV dtype, tensor parallel."""

    name: str
    num_layers: int
    num_kv_heads: int
    head_size: int
    dtype: str = "bfloat16"
    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        for field_name in ("num_layers", "num_kv_heads", "head_size", "tensor_parallel_size"):
            if getattr(self, field_name) < 1:
                raise ValueError(
                    f"{field_name} must be at least 1, got {getattr(self, field_name)}"
                )
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"unknown KV dtype {self.dtype!r}; use one of {sorted(DTYPE_BYTES)}")

    @property
    def kv_heads_per_gpu(self) -> int:
        return max(self.num_kv_heads // self.tensor_parallel_size, 1)

    def bytes_per_token(self) -> int:
        """KV bytes one token takes on each GPU."""
        per_layer = 2 * self.kv_heads_per_gpu * self.head_size * DTYPE_BYTES[self.dtype]
        return per_layer * self.num_layers

    def bytes_per_block(self, block_size: int) -> int:
        return self.bytes_per_token() * block_size

    def describe(self) -> str:
        parallel = f", tensor parallel {self.tensor_parallel_size}" * (
            self.tensor_parallel_size > 1
        )
        return (
            f"{self.name} ({self.num_layers} layers, {self.num_kv_heads} KV heads, head size "
            f"{self.head_size}, {self.dtype}{parallel}: {self.bytes_per_token() / 1024:g} KiB "
            "per token per GPU)"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Published model configs (config.json: num_hidden_layers, num_key_value_heads, head_dim).
MODELS = {
    spec.name: spec
    for spec in (
        KVSpec("llama-3.1-8b", 32, 8, 128),
        KVSpec("llama-3.1-70b", 80, 8, 128),
        KVSpec("mistral-7b", 32, 8, 128),
        KVSpec("qwen2.5-7b", 28, 4, 128),
        KVSpec("qwen2.5-72b", 80, 8, 128),
    )
}
DEFAULT_MODEL = "llama-3.1-8b"


def gib_for_blocks(spec: KVSpec, block_size: int, num_blocks: int) -> float:
    """GiB of KV cache per GPU that `num_blocks` blocks take."""
    return num_blocks * spec.bytes_per_block(block_size) / GIB


def blocks_for_gib(spec: KVSpec, block_size: int, gib: float) -> int:
    """Whole blocks that fit in `gib` GiB of KV cache per GPU."""
    return int(gib * GIB // spec.bytes_per_block(block_size))


@dataclass(frozen=True)
class GpuMemory:
    """The GPU a pool is sized on: its memory and the current `--gpu-memory-utilization`."""

    total_gib: float
    utilization: float = 0.9

    def __post_init__(self) -> None:
        if self.total_gib <= 0:
            raise ValueError(f"GPU memory must be positive, got {self.total_gib} GiB")
        if not 0 < self.utilization <= 1:
            raise ValueError(f"GPU memory utilization must be in (0, 1], got {self.utilization}")


def vllm_pool_settings(
    spec: KVSpec,
    block_size: int,
    num_blocks: int,
    current_gib: float,
    gpu: GpuMemory | None = None,
) -> list[str]:
    """The vLLM flags that give a pool of `num_blocks` when the engine's pool now takes
    `current_gib` per GPU: the block count itself, and the memory share that holds it."""
    settings = [f"--num-gpu-blocks-override {num_blocks}"]
    if gpu is not None:
        extra_gib = gib_for_blocks(spec, block_size, num_blocks) - current_gib
        utilization = gpu.utilization + extra_gib / gpu.total_gib
        if utilization <= 1:
            settings.append(f"--gpu-memory-utilization {utilization:.3f}")
        else:
            settings.append(
                f"(needs {extra_gib:+.1f} GiB per GPU: more than a {gpu.total_gib:g} GiB GPU "
                "has; use --kv-cache-dtype fp8 or more GPUs)"
            )
    return settings
