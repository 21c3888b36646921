"""Markers where the run's settings may have changed: each engine (engine id x DP rank) that
started after the run's first record and either took over from one that had stopped (an
engine restarted: another host:pid) or came with other settings than the engine that started
before it (another pool, block size, hash algorithm, model, vLLM version or most sequences
at once); an engine that joined a running fleet with the same settings changed nothing. The
label names every setting that changed against the engine before it; a setting not known on
both sides (a capture from before the collector kept each engine's) is not compared."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from collector.model.run_calendar import RunCalendar
from collector.model.time_window import TimeWindow
from collector.queries.fleet import engine_labels

Engine = Mapping[Any, Any]  # a row of `fleet.engine_starts`

# The settings of `fleet.engine_starts` a label names when they changed: column, words. The
# pool is the usable blocks of the engine's first pool step.
_SETTINGS = (
    ("pool_blocks", "{} blocks"),
    ("block_size", "block size {}"),
    ("hash_algo", "hash {}"),
    ("model", "model {}"),
    ("vllm_version", "vLLM {}"),
    ("max_num_seqs", "at most {} sequences"),
)


def engine_markers(starts: pd.DataFrame, window: TimeWindow) -> pd.DataFrame:
    """`t_s` and `label` of the engines of `fleet.engine_starts` marked (see above) that
    started inside the window."""
    names = engine_labels(starts["engine_id"], starts["dp_rank"])
    engines = starts.to_dict("records")
    stopped_before = starts["end_s"].cummin().shift()  # the first stop among earlier engines
    rows = []
    for number, (start, name, stopped) in enumerate(
        zip(engines, names, stopped_before, strict=True)
    ):
        t_s = float(start["t_s"])
        if t_s <= 0 or not window.start_s <= t_s < window.end_s:
            continue
        before = engines[number - 1] if number else None
        changes = _changes(start, before)
        if not changes and not stopped < t_s:
            continue
        pool = start["pool_blocks"]  # said as it is, unless a change says it
        said = [] if pd.isna(pool) or _changed(start, before, "pool_blocks") else [pool]
        label = [f"{name} started", *(f"{_shown(blocks)} blocks" for blocks in said), *changes]
        rows.append({"t_s": t_s, "label": ", ".join(label)})
    return pd.DataFrame(rows, columns=["t_s", "label"])


def _changes(start: Engine, before: Engine | None) -> list[str]:
    """Each setting of `start` known on both sides that differs from `before`'s, in the
    order of _SETTINGS and in words: "block size 32 (was 16)"."""
    if before is None:
        return []
    return [
        f"{words.format(_shown(start[column]))} (was {_shown(before[column])})"
        for column, words in _SETTINGS
        if _changed(start, before, column)
    ]


def _changed(start: Engine, before: Engine | None, column: str) -> bool:
    """Whether the setting is known for both engines and differs."""
    if before is None or pd.isna(start[column]) or pd.isna(before[column]):
        return False
    return _shown(start[column]) != _shown(before[column])


def _shown(value: Any) -> str:
    """A setting's value in words: a count with thousands separators."""
    if isinstance(value, int | float | np.number) and float(value).is_integer():
        return f"{int(value):,}"
    return str(value)


def marker_words(markers: pd.DataFrame, calendar: RunCalendar) -> str:
    """The markers as one line, each at its wall time."""
    return "; ".join(
        f"{calendar.wall(t_s):%a %d %b %H:%M} UTC ({t_s:,.0f} s): {label}"
        for t_s, label in zip(markers["t_s"], markers["label"], strict=True)
    )
