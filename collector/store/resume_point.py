"""Where a collector killed in the middle of a run goes on (`ResumePoint`): each engine's
next record number and newest time, the next vLLM KV event batch, and the blocks each
engine's cache held (cache_mirror.py), read from the whole run, a segmented run's closed
segments included (segmented_run.py), before the run file is opened to write on; and, for a
segmented run, the eviction ages' state its closed segments leave (eviction_ages.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pandas as pd

from collector.store.cache_mirror import BLOCK_STATES_SQL
from collector.store.eviction_ages import CLOSED_STATE_SQL
from collector.store.segmented_run import CLOSED_EVENTS

_STREAMS_SQL = (
    "SELECT engine_id, dp_rank, max(seq) + 1, max(ts_ns) FROM ("
    " SELECT engine_id, dp_rank, seq, ts_ns FROM events"
    " UNION ALL SELECT engine_id, dp_rank, seq, ts_ns FROM pool"
    " UNION ALL SELECT engine_id, dp_rank, seq, ts_ns FROM collisions)"
    " WHERE engine_id IS NOT NULL GROUP BY ALL"
)


class _Run(Protocol):
    """What a resume point is read from: a run open for reading (`RunFile`)."""

    def rows(
        self, sql: str, parameters: Sequence[object] | Mapping[str, object] | None = None
    ) -> list[tuple[Any, ...]]: ...

    def frame(
        self, sql: str, parameters: Sequence[object] | Mapping[str, object] | None = None
    ) -> pd.DataFrame: ...


@dataclass
class ResumePoint:
    """Per engine and DP rank: the record number after the last one stored, and the newest
    record's time; the vLLM KV event batch after the last one stored; the blocks the
    engines' caches held (`BLOCK_STATES_SQL`'s rows)."""

    streams: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    next_vllm_kv_batch: int = 0
    block_states: pd.DataFrame | None = None
    # A segmented run's: the eviction ages' state its closed segments leave.
    eviction_state: pd.DataFrame | None = None


def resume_point(run: _Run) -> ResumePoint:
    """Where the run `run` reads stopped."""
    streams = {
        (str(engine), int(rank or 0)): (int(next_seq), int(last_ts_ns))
        for engine, rank, next_seq, last_ts_ns in run.rows(_STREAMS_SQL)
    }
    batches = run.rows("SELECT coalesce(max(seq) + 1, 0) FROM vllm_kv_batches")
    point = ResumePoint(streams, int(batches[0][0]), run.frame(BLOCK_STATES_SQL))
    segmented = run.rows("SELECT 1 FROM duckdb_views() WHERE view_name = ?", [CLOSED_EVENTS])
    if segmented:
        for statement in CLOSED_STATE_SQL[:-1]:
            run.rows(statement)
        point.eviction_state = run.frame(CLOSED_STATE_SQL[-1])
    return point
