"""What a run was: its runs row (source, cache settings, versions, start and finish), and
where its records came from, as a phrase."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from pathlib import PurePath
from typing import Any, TypedDict, cast

from collector.model.step_model import StepModel
from collector.safe_text import shown
from collector.store.run_file import RunFile


class RunRow(TypedDict):
    """A run's runs row (collector/store/schema.py); options is JSON text."""

    run_id: str
    source: str
    trace: str | None
    timing: str | None
    block_size: int
    num_blocks: int
    hash_algo: str
    max_num_seqs: int | None
    vllm_version: str
    kvscope_version: str
    started_at: datetime
    options: str | None
    vllm_prefix_cache_queries: int | None
    vllm_prefix_cache_hits: int | None
    finished_at: datetime | None


def run_config(run: RunFile) -> RunRow:
    """The runs row: source, cache settings, versions, start and finish."""
    row = run.record("SELECT * FROM runs")
    if row is None:
        raise LookupError("the run file has no runs row")
    return cast(RunRow, row)


def recorded_tokenizer(config: Mapping[str, Any]) -> str:
    """The tokenizer a run names for its token ids: a replay's --tokenizer, else a live
    engine's model; "" when it names none."""
    options = run_options(config)
    return str(options.get("tokenizer") or options.get("model") or "")


def describe_source(config: Mapping[str, Any]) -> str:
    """Where a run's records came from, as a phrase: "replay of TRACE" (the trace file's
    name: its folder is the machine's that replayed it), "live capture of engine host:123",
    "vLLM KV events from tcp://..."."""
    options = run_options(config)
    if config["source"] == "engine":
        return f"live capture of engine {shown(options.get('engine_id') or '?')}"
    if config["source"] == "vllm-kv-events":
        return f"vLLM KV events from {shown(options.get('endpoint') or '?')}"
    trace = config["trace"]
    return f"{config['source']} of {shown(PurePath(trace).name if trace else trace)}"


def run_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """A runs row's options, whether still JSON text (as stored) or already parsed."""
    options = config.get("options") or {}
    return dict(json.loads(options) if isinstance(options, str) else options)


@dataclass(frozen=True)
class RecordedOptions:
    """The replay settings a run recorded among its options, None (False) where it recorded
    none: a live capture records fewer than a replay."""

    kv_layout: str | None = None
    max_num_batched_tokens: int | None = None
    max_loras: int | None = None
    engines: int | None = None
    router: str | None = None
    dp_size: int | None = None
    step_model: StepModel | None = None  # the fields it recorded, StepModel's for the rest
    cpu_tier: bool = False  # whether it replayed a CPU tier


def recorded_options(config: Mapping[str, Any]) -> RecordedOptions:
    """The replay settings among a runs row's options (`run_options`)."""
    options = run_options(config)
    step = options.get("step_model")
    return RecordedOptions(
        kv_layout=options.get("kv_layout"),
        max_num_batched_tokens=options.get("max_num_batched_tokens"),
        max_loras=options.get("max_loras"),
        engines=options.get("engines"),
        router=options.get("router"),
        dp_size=options.get("dp_size"),
        step_model=StepModel(
            **{known.name: step[known.name] for known in fields(StepModel) if known.name in step}
        )
        if step
        else None,
        cpu_tier=bool(options.get("cpu_tier")),
    )
