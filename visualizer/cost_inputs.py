"""The ROI assumptions as inputs (model, GPU, price, MFU, KV cache shape), kept for the
session so every page that prices something uses the same ones (visualizer/session.py)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import streamlit as st

from collector.model.cost import GPU_PRESETS, MODEL_PRESETS, CostModel
from visualizer import session

MODEL_KEY = "roi_model"
GPU_KEY = "roi_gpu"
PREFIX = "roi_"
_MODEL_FIELDS = (
    "parameters_billion",
    "num_layers",
    "num_attention_heads",
    "num_kv_heads",
    "head_size",
)
_GPU_FIELDS = ("gpu_peak_tflops", "gpu_memory_gb", "dollars_per_gpu_hour")
_NAMED_BY_PRESET = ("model_name", "gpu_name")


def _values() -> dict[str, Any]:
    """Every input's kept value, or its default."""
    defaults: dict[str, Any] = {
        PREFIX + field.name: field.default
        for field in fields(CostModel)
        if field.name not in _NAMED_BY_PRESET
    }
    defaults |= {MODEL_KEY: CostModel.model_name, GPU_KEY: CostModel.gpu_name}
    return {key: _kept_or(key, default) for key, default in defaults.items()}


def _kept_or(key: str, default: Any) -> Any:
    value = session.kept(key)
    return default if value is None else value


def _model_chosen() -> None:
    session.keeper(MODEL_KEY)()
    for name, value in zip(_MODEL_FIELDS, MODEL_PRESETS[st.session_state[MODEL_KEY]], strict=True):
        session.show(PREFIX + name, value)


def _gpu_chosen() -> None:
    session.keeper(GPU_KEY)()
    for name, value in zip(_GPU_FIELDS, GPU_PRESETS[st.session_state[GPU_KEY]], strict=True):
        session.show(PREFIX + name, value)


def current_cost_model() -> CostModel:
    """The assumptions as last set on the ROI page (the defaults before that)."""
    values = _values()
    model, gpu = str(values.pop(MODEL_KEY)), str(values.pop(GPU_KEY))
    arguments: dict[str, Any] = {key.removeprefix(PREFIX): value for key, value in values.items()}
    shape = tuple(arguments[name] for name in _MODEL_FIELDS)
    arguments["model_name"] = model if shape == MODEL_PRESETS[model] else f"custom ({model}-like)"
    hardware = tuple(arguments[name] for name in _GPU_FIELDS)
    arguments["gpu_name"] = gpu if hardware == GPU_PRESETS[gpu] else f"custom ({gpu}-like)"
    return CostModel(**arguments)


def _number(column: Any, label: str, name: str, **options: Any) -> None:
    key = PREFIX + name
    column.number_input(label, key=key, on_change=session.keeper(key), **options)


def render() -> CostModel:
    """The inputs, in an expander; returns the cost model they describe."""
    for key, value in _values().items():
        session.show(key, value)
    with st.expander("Assumptions (edit any of them)", expanded=True):
        first, second, third, fourth = st.columns(4)
        first.selectbox("Model", list(MODEL_PRESETS), key=MODEL_KEY, on_change=_model_chosen)
        _number(second, "Parameters (billions)", "parameters_billion", min_value=0.01, step=0.5)
        _number(third, "Layers", "num_layers", min_value=1, step=1)
        _number(fourth, "Attention heads", "num_attention_heads", min_value=1, step=1)
        _number(first, "KV heads", "num_kv_heads", min_value=1, step=1)
        _number(second, "Head size", "head_size", min_value=1, step=8)
        third.selectbox(
            "KV cache bytes per value",
            [1, 2, 4],
            key=PREFIX + "kv_dtype_bytes",
            on_change=session.keeper(PREFIX + "kv_dtype_bytes"),
            help="1: fp8, 2: bf16 / fp16, 4: fp32",
        )
        fourth.selectbox("GPU", list(GPU_PRESETS), key=GPU_KEY, on_change=_gpu_chosen)
        _number(first, "Peak TFLOP/s (dense BF16)", "gpu_peak_tflops", min_value=1.0, step=10.0)
        _number(second, "GPU memory (GB)", "gpu_memory_gb", min_value=1.0, step=8.0)
        _number(
            third,
            "MFU (model FLOPs utilisation)",
            "mfu",
            min_value=0.01,
            max_value=1.0,
            step=0.05,
        )
        _number(fourth, "$ per GPU-hour", "dollars_per_gpu_hour", min_value=0.0, step=0.25)
    return current_cost_model()
