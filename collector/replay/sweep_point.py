"""One point of a what-if sweep: its settings, and its replay into a run file.

The local process pool (collector/replay/whatif.py) and Ray's tasks
(collector/replay/ray_sweep.py) both replay a point through `replay_point`; its figures are
collector/replay/sweep_results.py's `PointFigures`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from collector.model.trace_request import TraceRequest
from collector.replay.replayer import ReplayOptions, replay_requests
from collector.replay.sweep_results import PointFigures


@dataclass(frozen=True)
class SweepPoint:
    """One configuration of a sweep."""

    block_size: int
    num_blocks: int
    max_num_seqs: int
    cpu_tier_blocks: int = 0
    cpu_tier_policy: str = "lru"
    engines: int = 1  # a fleet of this many engines behind `router`
    router: str = "round-robin"

    @property
    def run_name(self) -> str:
        tier = f"-tier{self.cpu_tier_blocks}{self.cpu_tier_policy}" * (self.cpu_tier_blocks > 0)
        fleet = f"-engines{self.engines}-{self.router}" * (self.engines > 1)
        return (
            f"bs{self.block_size}-blocks{self.num_blocks}-seqs{self.max_num_seqs}{tier}{fleet}"
            ".duckdb"
        )


def replay_point(
    requests: list[TraceRequest],
    point: SweepPoint,
    options: ReplayOptions,
    *,
    out_path: Path,
    source: Path,
    secret: bytes,
    progress: Callable[[int], None] | None = None,
) -> PointFigures:
    """Replay one point into `out_path`; its figures. `progress` counts requests replayed."""
    started = time.perf_counter()
    summary = replay_requests(requests, source, out_path, options, secret, progress=progress)
    return PointFigures(
        block_size=point.block_size,
        num_blocks=point.num_blocks,
        max_num_seqs=point.max_num_seqs,
        cpu_tier_blocks=point.cpu_tier_blocks,
        cpu_tier_policy=point.cpu_tier_policy,
        engines=point.engines,
        router=point.router,
        dp_size=options.dp_size,
        seconds=round(time.perf_counter() - started, 2),
        run=out_path.name,
        token_hit_ratio=summary["token_hit_ratio"],
        block_hit_ratio=summary["block_hit_ratio"],
        hit_tokens=summary["hit_tokens"],
        prompt_tokens=summary["prompt_tokens"],
        evictions=summary["evictions"],
        preemptions=summary["preemptions"],
        requests=summary["requests"],
        tier_hit_tokens=summary["tier_hit_tokens"],
        tier_token_hit_ratio=summary["tier_token_hit_ratio"],
    )
