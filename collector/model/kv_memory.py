"""KV cache blocks <-> GPU memory for a model's KV spec, and the vLLM settings that size a pool.

A full-attention block holds keys and values for `block_size` tokens in every layer:
2 * block_size * num_kv_heads * head_size * dtype bytes per layer (vLLM's
`FullAttentionSpec.page_size_bytes`), times the layers. With tensor parallelism each GPU
holds its share of the KV heads (at least one), and every GPU holds the same number of
blocks: `--num-gpu-blocks-override` counts blocks per GPU, vLLM's null block included.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
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
DEFAULT_GPU_GIB = 80.0  # about an H100's (80 GB): what sizing assumes unless told


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
    *,
    max_model_len: int | None = None,
) -> list[str]:
    """The vLLM settings that give a pool of `num_blocks` when the engine's pool now takes
    `current_gib` per GPU: first the one operators turn, the GPU memory share that holds it
    (checked against the GPU; when none does, what would: an fp8 KV cache, more tensor
    parallelism), then the block count itself; then, in brackets, an fp8 KV cache where it
    holds the pool in today's memory, and a warning where the pool is too small for
    `max_model_len` (vLLM refuses to start)."""
    settings = []
    if gpu is not None:
        extra_gib = gib_for_blocks(spec, block_size, num_blocks) - current_gib
        utilization = gpu.utilization + extra_gib / gpu.total_gib
        if utilization <= 1:
            settings.append(f"--gpu-memory-utilization {utilization:.3f}")
        else:
            settings.append(_does_not_fit(spec, block_size, num_blocks, current_gib, gpu))
    settings.append(f"--num-gpu-blocks-override {num_blocks}")
    fp8_blocks = blocks_for_gib(replace(spec, dtype="fp8"), block_size, current_gib)
    grows = num_blocks > blocks_for_gib(spec, block_size, current_gib)
    if grows and DTYPE_BYTES[spec.dtype] > 1 and fp8_blocks >= num_blocks:
        settings.append(
            f"(or, in today's memory: --kv-cache-dtype fp8 holds {fp8_blocks:,} blocks there, "
            "at some risk to accuracy)"
        )
    if max_model_len is not None and num_blocks * block_size < max_model_len:
        settings.append(
            f"(too small for --max-model-len {max_model_len:,}: vLLM refuses to start with a "
            f"pool of fewer than {-(-max_model_len // block_size):,} blocks; lower "
            f"--max-model-len to {num_blocks * block_size:,} or less)"
        )
    return settings


def _does_not_fit(
    spec: KVSpec, block_size: int, num_blocks: int, current_gib: float, gpu: GpuMemory
) -> str:
    """Why no memory share gives the pool on this GPU, and which other knob would."""
    most_gib = current_gib + (1 - gpu.utilization) * gpu.total_gib  # at utilization 1.0
    needed_gib = gib_for_blocks(spec, block_size, num_blocks)
    ways = []
    if DTYPE_BYTES[spec.dtype] > 1:
        fp8 = replace(spec, dtype="fp8")
        fp8_gib = gib_for_blocks(fp8, block_size, num_blocks)
        if fp8_gib <= most_gib:
            ways.append(f"--kv-cache-dtype fp8 takes it to {fp8_gib:.1f} GiB")
    wider = replace(spec, tensor_parallel_size=2 * spec.tensor_parallel_size)
    if wider.kv_heads_per_gpu < spec.kv_heads_per_gpu:
        wider_gib = gib_for_blocks(wider, block_size, num_blocks)
        if wider_gib <= most_gib:
            ways.append(
                f"--tensor-parallel-size {wider.tensor_parallel_size} takes it to "
                f"{wider_gib:.1f} GiB per GPU"
            )
    instead = "; ".join(ways) if ways else "it needs a larger GPU"
    return (
        f"(no --gpu-memory-utilization holds it: {num_blocks:,} blocks take {needed_gib:.1f} "
        f"GiB per GPU, and this {gpu.total_gib:g} GiB GPU can give the KV cache "
        f"{most_gib:.1f} GiB at most; {instead})"
    )
