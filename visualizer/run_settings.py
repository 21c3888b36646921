"""The run's configuration as an operator reads it: a short table of settings by their human
names, with the raw keys of the runs row (and its JSON options, spread a key a row) behind a
toggle, for whoever needs the exact values."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
import streamlit as st

from collector.queries import kv_groups
from collector.queries.config import RunRow, describe_source, run_options
from collector.queries.fleet import engine_lineages
from collector.store.run_file import RunFile
from visualizer import engine_pools

Setting = tuple[str, str, str]  # human name, value as shown, the raw keys behind it


def render(run: RunFile, config: RunRow, starts: pd.DataFrame) -> None:
    """The short table; with the toggle on, each setting's raw keys and every key recorded.
    `starts`: the run's `fleet.engine_starts`, with each engine's settings."""
    st.subheader("Run configuration")
    raw = st.toggle("Show the raw keys", key="overview_config_raw_keys")
    rows = pd.DataFrame(settings(run, config, starts), columns=["setting", "value", "raw keys"])
    shown = rows if raw else rows[["setting", "value"]]
    height = 35 * (len(rows) + 1) + 3
    st.dataframe(shown, hide_index=True, height=height, key="overview_config")
    if raw:
        st.caption("Every setting the run recorded, by its key:")
        st.dataframe(raw_rows(config), hide_index=True, key="overview_config_raw")


def settings(run: RunFile, config: RunRow, starts: pd.DataFrame) -> list[Setting]:
    """The settings that matter to an operator, each with the raw keys it shows; a setting the
    run did not record is left out; a fleet's block size and pool by engine where its engines
    (`starts`) differ."""
    options = run_options(config)
    rows: list[Setting] = [
        ("where the records came from", describe_source(config), "source, trace")
    ]
    per_engine = not engine_pools.alike(starts)
    if per_engine:  # a fleet whose engines differ: each engine's, as its batches announced
        words = engine_pools.pool_words(starts, config, engine_lineages(run))
        rows.append(("block size and pool", words, _POOLS))
    for name, keys, value in _SHOWN:
        shown = value(config, options)
        if shown is not None and not (per_engine and name in _PER_ENGINE):
            rows.append((name, shown, keys))
    groups = kv_groups.layout(run)
    rows.append(
        (
            "KV cache groups",
            "; ".join(kv_groups.describe(group) for group in groups),
            "options.kv_layout, options.kv_groups",
        )
    )
    return rows


def _count(value: Any, unit: str = "") -> str | None:
    return None if value is None else f"{int(value):,}{unit}"


def _pool(config: RunRow, options: dict[str, Any]) -> str | None:
    blocks, size = config.get("num_blocks"), config.get("block_size")
    if blocks is None or size is None:
        return None
    engines = int(options.get("engines") or 1) * int(options.get("dp_size") or 1)
    each = " per engine" if engines > 1 else ""
    return f"{int(blocks):,} blocks{each} ({int(blocks) * int(size):,} tokens of KV cache)"


def _tier(config: RunRow, options: dict[str, Any]) -> str | None:
    tier = options.get("cpu_tier")
    if not isinstance(tier, dict):
        return "none" if "cpu_tier" in options else None
    return f"{int(tier['num_blocks']):,} blocks, {str(tier.get('policy', '')).upper()} eviction"


def _step(config: RunRow, options: dict[str, Any]) -> str | None:
    step = options.get("step_model")
    if not isinstance(step, dict):
        return None
    return (
        f"{step['step_ms']:g} ms a step + {step['prefill_us_per_token']:g} µs a prefill token "
        f"+ {step['decode_us_per_token']:g} µs a decoded token"
    )


def _vllm_counter(config: RunRow, options: dict[str, Any]) -> str | None:
    queries, hits = config.get("vllm_prefix_cache_queries"), config.get("vllm_prefix_cache_hits")
    if not queries or hits is None:
        return None
    return f"{int(hits):,} of {int(queries):,} prompt tokens ({int(hits) / int(queries):.1%})"


def _span(config: RunRow, options: dict[str, Any]) -> str | None:
    start, end = config.get("started_at"), config.get("finished_at")
    if start is None:
        return None
    started = pd.Timestamp(start).strftime("%Y-%m-%d %H:%M:%S")
    if end is None:
        return f"from {started}, not finished"
    return f"{started}, for {(pd.Timestamp(end) - pd.Timestamp(start)).total_seconds():,.1f} s"


def _versions(config: RunRow) -> str:
    return f"vLLM {config.get('vllm_version')}, kvscope {config.get('kvscope_version')}"


def _yes(value: Any) -> str | None:
    return None if value is None else ("yes" if value else "no")


_IDS = "record_token_ids"
# The run's block size and pool, which a fleet's engines may each have had their own of.
_PER_ENGINE = ("block size", "KV cache pool")
_POOLS = "meta: engine_settings ENGINE dpRANK (block_size, num_blocks)"
_SHOWN: list[tuple[str, str, Callable[[RunRow, dict[str, Any]], str | None]]] = [
    ("block size", "block_size", lambda c, o: _count(c.get("block_size"), " tokens")),
    ("KV cache pool", "num_blocks, block_size, options.engines", _pool),
    ("engines", "options.engines", lambda c, o: _count(o.get("engines"))),
    ("data-parallel ranks", "options.dp_size", lambda c, o: _count(o.get("dp_size"))),
    ("CPU tier (offload)", "options.cpu_tier", _tier),
    ("hash algorithm", "hash_algo", lambda c, o: c.get("hash_algo")),
    ("collision check", "options.check_collisions", lambda c, o: _yes(o.get("check_collisions"))),
    ("max running requests", "max_num_seqs", lambda c, o: _count(c.get("max_num_seqs"))),
    (
        "max tokens per step",
        "options.max_num_batched_tokens",
        lambda c, o: _count(o.get("max_num_batched_tokens")),
    ),
    ("max LoRA adapters at once", "options.max_loras", lambda c, o: _count(o.get("max_loras"))),
    (
        "prompt token ids recorded",
        "options.record_token_ids",
        lambda c, o: _yes(o.get("record_token_ids")),
    ),
    ("tenants shown by name", "options.reveal_tenants", lambda c, o: _yes(o.get("reveal_tenants"))),
    ("tokenizer", "options.tokenizer", lambda c, o: o.get("tokenizer") or None),
    ("modelled step time (replay)", "options.step_model", _step),
    ("replay timing", "timing", lambda c, o: c.get("timing")),
    (
        "vLLM's own prefix-cache counter",
        "vllm_prefix_cache_hits, vllm_prefix_cache_queries",
        _vllm_counter,
    ),
    ("captured", "started_at, finished_at", _span),
    (
        "versions",
        "vllm_version, kvscope_version",
        lambda c, o: f"vLLM {c.get('vllm_version')}, kvscope {c.get('kvscope_version')}",
    ),
]


def raw_rows(config: RunRow) -> pd.DataFrame:
    """The runs row, one setting a row, its options (JSON) spread over a row each, down to
    plain values (`options.step_model.step_ms`, `options.kv_groups[0].kind`)."""
    raw: dict[str, Any] = {name: value for name, value in config.items() if name != "options"}
    raw |= _spread("options", run_options(config))
    return pd.DataFrame(
        {"key": list(raw), "value": ["" if value is None else str(value) for value in raw.values()]}
    )


def _spread(name: str, value: Any) -> dict[str, Any]:
    """A JSON value as rows of plain values, named by their path under `name`."""
    if isinstance(value, dict):
        return {
            row: shown
            for key in sorted(value)
            for row, shown in _spread(f"{name}.{key}", value[key]).items()
        }
    if isinstance(value, list) and value:
        return {
            row: shown
            for index, item in enumerate(value)
            for row, shown in _spread(f"{name}[{index}]", item).items()
        }
    return {name: value}
