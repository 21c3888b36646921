"""The model and KV cache dtype a page's memory figures assume, as two inputs the user can
change (the Advisor and Cache policies pages)."""

from __future__ import annotations

from typing import Any

from collector.model.kv_memory import DEFAULT_MODEL, DTYPE_BYTES, MODELS


def model_and_dtype(first: Any, second: Any, key: str) -> tuple[str, str]:
    """A model picker in column `first` and a KV dtype picker in `second`, keyed `key_model`
    and `key_dtype`; returns the chosen model name and dtype."""
    model = first.selectbox(
        "Model (KV spec)",
        sorted(MODELS),
        index=sorted(MODELS).index(DEFAULT_MODEL),
        key=f"{key}_model",
    )
    dtype = second.selectbox(
        "KV cache dtype",
        sorted(DTYPE_BYTES),
        index=sorted(DTYPE_BYTES).index("bfloat16"),
        key=f"{key}_dtype",
    )
    return str(model), str(dtype)
