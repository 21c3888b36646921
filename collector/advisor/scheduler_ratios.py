"""What a Scheduler check gives: the token hit ratios of a run's requests replayed through
vLLM's Scheduler, by pool size (collector/advisor/scheduler_check.py replays them; a
`RunContext` keeps them, so that every rule that asks shares one replay)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SchedulerCheck:
    """Token hit ratios of the run's requests replayed through vLLM's Scheduler, by pool
    size; none, and `skipped` saying why, where the run cannot or need not be replayed."""

    ratios: dict[int, float] = field(default_factory=dict)
    skipped: str = ""
