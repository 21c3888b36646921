"""Return on the prefix cache: the prefill compute its hits saved, as time per request (the
TTFT a hit takes off), GPU-hours and money per day at the run's request rate, from an
explicit, editable cost model.

Prefill compute of a prompt's first h tokens (FLOPs, causal attention):
    2 * parameters * h                       (every weight matrix, once per token)
  + 2 * layers * (heads * head size) * h * (h + 1)
                                             (token p attends to p + 1 keys: QK^T and AV,
                                              2 FLOPs per multiply-add each)
A hit on those h tokens saves exactly that: the tokens after them attend to the same keys
either way. Prefill time = FLOPs / (peak FLOP/s * MFU): the GPU time of one prompt's
prefill, the part of its TTFT the cache can take off (queueing and batching add to it).
GPU-seconds saved over a window, scaled to a day at the window's request rate, give GPU-hours
per day; money = GPU-hours * $/GPU-hour.
A block hit at position k (block size b) saves the same terms for its b tokens, so per block
hash: hits * (2 * parameters * b + 2 * layers * width * b * (2 * k * b + b + 1)).
Memory held: a cached block holds 2 (K and V) * layers * KV heads * head size * dtype bytes
* b bytes. vLLM allocates the KV cache up front, so what cached blocks hold is shown as
memory, not priced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import pandas as pd

# Published shapes of common models: parameters (billions), layers, attention heads,
# KV heads, head size.
MODEL_PRESETS: dict[str, tuple[float, int, int, int, int]] = {
    "Llama-3.1-8B": (8.03, 32, 32, 8, 128),
    "Llama-3.1-70B": (70.6, 80, 64, 8, 128),
    "Qwen2.5-7B": (7.62, 28, 28, 4, 128),
    "Qwen2.5-72B": (72.7, 80, 64, 8, 128),
    "Mistral-7B": (7.25, 32, 32, 8, 128),
}
# Dense BF16 tensor TFLOP/s, memory (GB), and an assumed rental price ($/GPU-hour).
GPU_PRESETS: dict[str, tuple[float, float, float]] = {
    "H100 SXM": (989.0, 80.0, 2.50),
    "H200": (989.0, 141.0, 3.50),
    "A100 80GB": (312.0, 80.0, 1.50),
    "L40S": (362.0, 48.0, 1.00),
    "L4": (121.0, 24.0, 0.50),
}
BYTES_PER_GB = 1e9


Numbers = TypeVar("Numbers", float, pd.Series)


SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86_400.0


@dataclass(frozen=True)
class CostModel:
    """The assumptions behind every ROI estimate (defaults: Llama-3.1-8B on an H100 SXM)."""

    model_name: str = "Llama-3.1-8B"
    parameters_billion: float = 8.03
    num_layers: int = 32
    num_attention_heads: int = 32
    num_kv_heads: int = 8
    head_size: int = 128
    kv_dtype_bytes: int = 2
    gpu_name: str = "H100 SXM"
    gpu_peak_tflops: float = 989.0
    gpu_memory_gb: float = 80.0
    mfu: float = 0.40
    dollars_per_gpu_hour: float = 2.50

    def kv_bytes_per_block(self, block_size: int) -> int:
        """Bytes of K and V one cached block holds."""
        per_token = 2 * self.num_layers * self.num_kv_heads * self.head_size
        return per_token * self.kv_dtype_bytes * block_size

    def prompt_flops(self, hit_tokens: Numbers, hit_tokens_squared: Numbers) -> Numbers:
        """FLOPs of prefill saved, given the sum of h and of h^2 over prompts."""
        parameters = self.parameters_billion * 1e9
        width = self.num_attention_heads * self.head_size
        attention = 2.0 * self.num_layers * width * (hit_tokens_squared + hit_tokens)
        return 2.0 * parameters * hit_tokens + attention

    def block_flops(self, block_hits: Numbers, position_hits: Numbers, block_size: int) -> Numbers:
        """FLOPs saved by block hits, given the sum of hits and of hits * position."""
        parameters = self.parameters_billion * 1e9
        width = self.num_attention_heads * self.head_size
        per_hit = 2.0 * parameters * block_size + 2.0 * self.num_layers * width * block_size * (
            block_size + 1
        )
        per_position = 4.0 * self.num_layers * width * block_size * block_size
        return per_hit * block_hits + per_position * position_hits

    def gpu_seconds(self, flops: Numbers) -> Numbers:
        return flops / (self.gpu_peak_tflops * 1e12 * self.mfu)

    def dollars(self, gpu_seconds: Numbers) -> Numbers:
        return gpu_seconds / SECONDS_PER_HOUR * self.dollars_per_gpu_hour

    def compute_assumptions(self) -> str:
        """The compute assumptions, in one line, to print next to an estimate."""
        return (
            f"{self.model_name}: {self.parameters_billion:g} B parameters, {self.num_layers} "
            f"layers x {self.num_attention_heads} heads x {self.head_size}; {self.gpu_name} "
            f"at {self.gpu_peak_tflops:g} TFLOP/s peak, {self.mfu:.0%} MFU, "
            f"${self.dollars_per_gpu_hour:,.2f} (USD) per GPU-hour"
        )

    def memory_assumptions(self, block_size: int) -> str:
        """The memory assumptions, in one line, to print next to an estimate."""
        return (
            f"{self.kv_bytes_per_block(block_size) / 2**20:.3g} MiB per block = 2 x "
            f"{self.num_layers} layers x {self.num_kv_heads} KV heads x {self.head_size} x "
            f"{self.kv_dtype_bytes} bytes x {block_size} tokens"
        )


def price_prompts(frame: pd.DataFrame, model: CostModel, block_size: int) -> pd.DataFrame:
    """Rows with hit_tokens, hit_tokens_squared and block_seconds, priced: GPU-seconds and
    dollars saved, and the GB-hours their cached blocks held."""
    flops = model.prompt_flops(frame["hit_tokens"], frame["hit_tokens_squared"])
    return _priced(frame, model, block_size, flops)


def price_blocks(frame: pd.DataFrame, model: CostModel, block_size: int) -> pd.DataFrame:
    """Rows with block_hits, position_hits and block_seconds, priced as `price_prompts`."""
    flops = model.block_flops(frame["block_hits"], frame["position_hits"], block_size)
    return _priced(frame, model, block_size, flops)


def _priced(frame: pd.DataFrame, model: CostModel, block_size: int, flops: Any) -> pd.DataFrame:
    gpu_seconds = model.gpu_seconds(flops)
    byte_seconds = frame["block_seconds"] * model.kv_bytes_per_block(block_size)
    return frame.assign(
        gpu_seconds_saved=gpu_seconds,
        dollars_saved=model.dollars(gpu_seconds),
        gb_hours_held=byte_seconds / BYTES_PER_GB / SECONDS_PER_HOUR,
    )


def _days_per(duration_s: float) -> float:
    """How many windows of `duration_s` make a day (0 for an empty window)."""
    return SECONDS_PER_DAY / duration_s if duration_s > 0 else 0.0


def per_day(priced: pd.DataFrame, duration_s: float) -> pd.DataFrame:
    """Priced rows with their savings scaled to a day at the window's rate (0 for an empty
    window): GPU-hours and dollars per day."""
    scale = _days_per(duration_s)
    return priced.assign(
        gpu_hours_per_day=priced["gpu_seconds_saved"] * scale / SECONDS_PER_HOUR,
        dollars_per_day=priced["dollars_saved"] * scale,
    )


def savings_over_time(points: pd.DataFrame, model: CostModel, block_size: int) -> pd.DataFrame:
    """Points of `activity.figures_over_time`: GPU-seconds and dollars saved per point, and
    GB held by cached blocks at each point's end."""
    gpu_seconds = model.gpu_seconds(
        model.prompt_flops(points["hit_tokens"], points["hit_tokens_squared"])
    )
    bytes_per_block = model.kv_bytes_per_block(block_size)
    return pd.DataFrame(
        {
            "t_s": points["t_s"],
            "width_s": points["width_s"],
            "gpu_seconds_saved": gpu_seconds,
            "dollars_saved": model.dollars(gpu_seconds),
            "gb_held": points["cached_blocks"] * bytes_per_block / BYTES_PER_GB,
        }
    )


@dataclass(frozen=True)
class PromptTotals:
    """A window's prompts as the ROI needs them: how many, and the sums of their prompt and
    hit tokens and of their squares (`activity.window_figures`)."""

    requests: int
    prompt_tokens: int
    prompt_tokens_squared: int
    hit_tokens: int
    hit_tokens_squared: int


def roi_figures(
    model: CostModel,
    prompts: PromptTotals,
    *,
    block_seconds: float,
    block_size: int,
    duration_s: float,
) -> dict[str, float]:
    """The window's savings priced with `model`: per request, the prefill time of its prompt
    uncached and with its hit (mean, ms); in the window, GPU-seconds and dollars saved; per
    day at the window's rate, GPU-hours and dollars saved; and the GB its cached blocks held
    on average."""
    uncached_s = model.gpu_seconds(
        model.prompt_flops(float(prompts.prompt_tokens), float(prompts.prompt_tokens_squared))
    )
    saved_s = model.gpu_seconds(
        model.prompt_flops(float(prompts.hit_tokens), float(prompts.hit_tokens_squared))
    )
    requests = prompts.requests
    scale = _days_per(duration_s)
    gb_seconds = block_seconds * model.kv_bytes_per_block(block_size) / BYTES_PER_GB
    return {
        "prefill_ms_uncached": 1000 * uncached_s / requests if requests else 0.0,
        "prefill_ms_cached": 1000 * (uncached_s - saved_s) / requests if requests else 0.0,
        "gpu_seconds_saved": saved_s,
        "dollars_saved": model.dollars(saved_s),
        "gpu_hours_per_day": saved_s * scale / SECONDS_PER_HOUR,
        "dollars_per_day": model.dollars(saved_s) * scale,
        "requests_per_hour": requests * SECONDS_PER_HOUR / duration_s if duration_s > 0 else 0.0,
        "mean_gb_held": gb_seconds / duration_s if duration_s > 0 else 0.0,
    }
