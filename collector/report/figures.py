"""What the report reads from one run file: its figures, and the series its charts draw."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from collector.queries.config import RunRow, run_config
from collector.queries.pool import (
    FreeBlockExtremes,
    RegretSummary,
    eviction_regret_summary,
    free_block_extremes,
    pool_timeline,
)
from collector.queries.summary import RunSummary, run_summary
from collector.queries.tenants import TenantHitRatio, tenant_hit_ratios
from collector.queries.timeline import event_times, hit_rate_over_time
from collector.report.miss_breakdown import MissBreakdown, read_breakdown
from collector.store.run_file import RunStore

HIT_RATE_BUCKETS = 60
POOL_POINTS = 600
EVICTION_POINTS = 300


@dataclass(frozen=True)
class RunFigures:
    """One run's figures: `run_summary`, eviction regret, free-block extremes, tenants, and
    the prompt tokens per miss cause (`misses`)."""

    path: Path
    config: dict[str, Any]  # the runs row as JSON-ready values
    summary: RunSummary
    regret: RegretSummary
    free_blocks: FreeBlockExtremes
    tenants: list[TenantHitRatio]
    misses: MissBreakdown = field(default_factory=MissBreakdown)

    @property
    def evictions_per_request(self) -> float:
        return self._per_request("evictions")

    @property
    def preemptions_per_request(self) -> float:
        return self._per_request("preemptions")

    def _per_request(self, figure: Literal["evictions", "preemptions"]) -> float:
        requests = self.summary["requests"]
        return float(self.summary[figure] / requests) if requests else 0.0

    @property
    def min_free_blocks(self) -> int:
        return int(self.free_blocks["min_free_blocks"])

    @property
    def min_free_share(self) -> float:
        usable = self.free_blocks["usable_blocks"]
        return float(self.min_free_blocks / usable) if usable else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Every figure, as JSON-ready values."""
        return {
            "path": str(self.path),
            "config": self.config,
            "summary": self.summary,
            "evictions_per_request": self.evictions_per_request,
            "preemptions_per_request": self.preemptions_per_request,
            "eviction_regret": self.regret,
            "free_blocks": {**self.free_blocks, "min_free_share": self.min_free_share},
            "tenants": [asdict(row) for row in self.tenants],
            "miss_causes": self.misses.to_dict(),
        }


@dataclass(frozen=True)
class RunSeries:
    """One run's series over time, for the report's charts."""

    hit_rate: pd.DataFrame
    pool: pd.DataFrame
    evictions: pd.DataFrame
    usable_blocks: int


def read_run(path: Path, regret_within_s: float | None) -> tuple[RunFigures, RunSeries]:
    """Open a run file (schema checked) and read its figures and series."""
    store = RunStore.open(path)
    try:
        free_blocks = free_block_extremes(store)
        figures = RunFigures(
            path=path,
            config=_plain_config(run_config(store)),
            summary=run_summary(store),
            regret=eviction_regret_summary(store, regret_within_s),
            free_blocks=free_blocks,
            tenants=_tenant_rows(tenant_hit_ratios(store)),
            misses=read_breakdown(store),
        )
        series = RunSeries(
            hit_rate=hit_rate_over_time(store, HIT_RATE_BUCKETS),
            pool=pool_timeline(store, POOL_POINTS),
            evictions=event_times(store, "evict", EVICTION_POINTS),
            usable_blocks=int(free_blocks["usable_blocks"]),
        )
    finally:
        store.close()
    return figures, series


def _plain_config(config: RunRow) -> dict[str, Any]:
    """The runs row with times as ISO text and options decoded."""
    plain: dict[str, Any] = dict(config)
    for name, value in config.items():
        if isinstance(value, datetime):
            plain[name] = value.isoformat()
    if isinstance(plain.get("options"), str):
        plain["options"] = json.loads(plain["options"])
    return plain


def _tenant_rows(frame: pd.DataFrame) -> list[TenantHitRatio]:
    """Per tenant and adapter: counts as ints, the hit ratio as a float."""
    return [
        TenantHitRatio(
            tenant=str(row["tenant"]),
            lora=str(row["lora"]),
            requests=int(row["requests"]),
            prompt_tokens=int(row["prompt_tokens"]),
            hit_tokens=int(row["hit_tokens"]),
            hit_ratio=float(row["hit_ratio"]),
        )
        for row in frame.to_dict("records")
    ]
