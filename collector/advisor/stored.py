"""The advisor's result worked out once and read back after: `kvscope advise` keeps it in the
run file (collector/store/stored_advice.py), the Advisor page and the health scorecard read
it there, so neither waits for the rules' replays through vLLM.

A kept result is the advice document (`kvscope advise --json`) and the Advisor page's
what-if curves, with the inputs they were worked out from: the run's content (a digest of
its rows, which writing the advice does not change), kvscope's code (`code_digest`), the
installed vLLM's version and the assumptions (KV spec, GPU, --max-model-len, PCIe
bandwidth). It is served only where all four are the same: a run that grew or was written
again, another kvscope or another vLLM works the advice out afresh; but where no vLLM is
installed (the app's own environment), the advice kept under any vLLM is served, since its
rules' replays through vLLM are more than that environment can do. Advice given a what-if
sweep is never kept (the sweep's folder is not part of the run).

Where the run file cannot be written (a Parquet dataset, a read-only file, one another
process holds open, as the app does) the result goes to the replay cache instead
(replay_cache.py: kvscope's cache folder, keyed by the run file's bytes); the Advisor page
keeps its results there only, never writing a run file it shows.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from collector.advisor.context import PCIE_GB_PER_S, RunContext
from collector.advisor.replay_cache import ReplayCache, code_digest, vllm_version
from collector.model.kv_memory import DEFAULT_GPU_GIB, DEFAULT_MODEL, MODELS, GpuMemory
from collector.store.run_file import RunFile
from collector.store.stored_advice import content_digest, read_advice, write_advice

FORMAT = 1  # of the kept result: a change makes every earlier one unread


def assumptions(context: RunContext) -> dict[str, Any] | None:
    """What the advice assumes beyond the run, as JSON; None where it is not kept (a sweep)."""
    if context.whatif:
        return None
    return {
        "kv_spec": context.spec.to_dict(),
        "gpu": asdict(context.gpu) if context.gpu else None,
        "max_model_len": context.max_model_len,
        "pcie_gb_per_s": context.pcie_gb_per_s,
    }


def _inputs(run: RunFile, assumed: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "run_content": content_digest(run),
        "code": code_digest(),
        "vllm": vllm_version(),
        "assumptions": assumed,
    }


def _same(one: Any, other: Any) -> bool:
    return json.dumps(one, sort_keys=True) == json.dumps(other, sort_keys=True)


def _serves(kept: dict[str, Any], now: dict[str, Any]) -> bool:
    """Whether a kept result's inputs serve these: the same, but for the vLLM it was worked
    out with where this environment has none (the app's alone, `.ci/setup --app`): a result
    whose rules replayed the run through vLLM is more than such an environment can work out."""
    if now.get("vllm") is None:
        kept = {**kept, "vllm": None}
    return _same(kept, now)


def _parsed(text: str | None) -> dict[str, Any] | None:
    try:
        record = json.loads(text) if text else None
    except ValueError:
        return None
    keys = {"inputs", "stored_at", "document", "curves"}
    return record if isinstance(record, dict) and keys <= record.keys() else None


def _cache_key(assumed: dict[str, Any]) -> str:
    return f"advice {json.dumps(assumed, sort_keys=True)}"


def default_assumptions() -> dict[str, Any]:
    """What `kvscope advise RUN` and the Advisor page assume when told nothing."""
    return {
        "kv_spec": MODELS[DEFAULT_MODEL].to_dict(),
        "gpu": asdict(GpuMemory(DEFAULT_GPU_GIB)),
        "max_model_len": None,
        "pcie_gb_per_s": PCIE_GB_PER_S,
    }


def current_result(run: RunFile) -> dict[str, Any] | None:
    """The result kept for this run, this kvscope and this vLLM: the run file's (whatever
    it assumed), else the replay cache's under the default assumptions; None if neither."""
    record = _parsed(read_advice(run))
    if record is not None and _serves(
        record["inputs"], _inputs(run, record["inputs"].get("assumptions"))
    ):
        return record
    return _parsed(json.dumps(ReplayCache(run.path).get(_cache_key(default_assumptions()))))


def lookup(context: RunContext) -> dict[str, Any] | None:
    """The kept result for this run under this context's assumptions, from the run file or
    else the replay cache; its document names the run as `context.path`."""
    assumed = assumptions(context)
    if assumed is None:
        return None
    record = _parsed(read_advice(context.run))
    if record is None or not _serves(record["inputs"], _inputs(context.run, assumed)):
        record = _parsed(json.dumps(context.replay_cache.get(_cache_key(assumed))))
        if record is None:
            return None
    return {**record, "document": {**record["document"], "run": str(context.path)}}


def result_record(
    context: RunContext, document: dict[str, Any], curves: dict[str, Any]
) -> dict[str, Any] | None:
    """The record to keep for a result just worked out (while the run is open); None where
    it is not kept."""
    assumed = assumptions(context)
    if assumed is None:
        return None
    stored_at = datetime.now(UTC).isoformat(timespec="seconds")
    inputs = _inputs(context.run, assumed)
    return {"inputs": inputs, "stored_at": stored_at, "document": document, "curves": curves}


def keep(
    record: dict[str, Any], path: Path, cache: Callable[[], ReplayCache], *, in_run: bool
) -> str:
    """Keep `record` in the run file at `path` if `in_run` (no connection to it may be open
    in this process) and it can be written, else in `cache()` (asked for only then: it reads
    every byte of the run); where it went, in a line."""
    why = write_advice(path, json.dumps(record, sort_keys=True)) if in_run else None
    if in_run and why is None:
        return "the advice kept in the run file, for the app and the health scorecard"
    reason = f": the run file could not be written ({why})" if why else ""
    kept = cache()
    if not kept.keeps:
        return f"the advice not kept{reason}, and the cache folder keeps nothing without vLLM"
    kept.put(_cache_key(record["inputs"]["assumptions"]), record)
    return f"the advice kept in kvscope's cache folder{reason}"
