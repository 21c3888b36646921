"""Command-line options for a model's KV spec and GPU memory (`whatif`, `advise`)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from collector.model.kv_memory import DEFAULT_GPU_GIB, DEFAULT_MODEL, DTYPE_BYTES, MODELS, GpuMemory


def add_kv_options(parser: Any) -> None:
    """--model, its overrides, and the GPU memory that turns blocks into settings."""
    group = parser.add_argument_group(
        "KV memory", "turn blocks into GiB and vLLM memory settings for this model"
    )
    group.add_argument(
        "--model",
        choices=sorted(MODELS),
        default=DEFAULT_MODEL,
        help=f"the model whose KV cache shape sizes blocks in GiB ({DEFAULT_MODEL})",
    )
    group.add_argument("--num-layers", type=int, help="override the model's layer count")
    group.add_argument("--num-kv-heads", type=int, help="override the model's KV heads")
    group.add_argument("--head-size", type=int, help="override the model's head size")
    group.add_argument("--kv-dtype", choices=sorted(DTYPE_BYTES), help="KV cache dtype")
    group.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="GPUs the KV heads are split over (1)",
    )
    group.add_argument(
        "--gpu-memory-gib",
        type=float,
        default=DEFAULT_GPU_GIB,
        help=f"memory of one GPU, GiB ({DEFAULT_GPU_GIB:g}: about an H100's; 0: unknown)",
    )
    group.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="the engine's current --gpu-memory-utilization (0.9)",
    )
    group.add_argument(
        "--max-model-len",
        type=_at_least_one,
        help="the engine's --max-model-len: pools too small for one request that long are "
        "flagged, since vLLM refuses to start with them (default: not checked)",
    )


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def kv_spec_from(args: argparse.Namespace) -> Any:
    """The KVSpec the options describe."""
    spec = MODELS[args.model]
    overrides = {
        "num_layers": args.num_layers,
        "num_kv_heads": args.num_kv_heads,
        "head_size": args.head_size,
        "dtype": args.kv_dtype,
    }
    chosen = {name: value for name, value in overrides.items() if value is not None}
    name = f"{spec.name} (modified)" if chosen else spec.name
    return replace(spec, name=name, tensor_parallel_size=args.tensor_parallel_size, **chosen)


def gpu_from(args: argparse.Namespace) -> Any:
    """The GPU memory the options describe, or None when the GPU's size is unknown (0)."""
    if not args.gpu_memory_gib:
        return None
    return GpuMemory(args.gpu_memory_gib, args.gpu_memory_utilization)
