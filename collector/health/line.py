"""One line of the health scorecard: a status, one sentence of why, the app page that shows it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["green", "amber", "red", "grey"]
# Worst first: a line made of several checks takes the worst of them.
SEVERITY: dict[Status, int] = {"red": 3, "amber": 2, "green": 1, "grey": 0}


@dataclass(frozen=True)
class HealthLine:
    """`name`: what is judged; `status`: green (well), amber (look), red (act) or grey (not
    applicable to this run); `sentence`: why, with its numbers; `page`: the app page that
    shows it, as the file of visualizer/views/ names it without ".py"."""

    name: str
    status: Status
    sentence: str
    page: str


def rising(value: float, amber: float, red: float) -> Status:
    """Green under `amber`, amber from it, red from `red` (higher is worse)."""
    if value >= red:
        return "red"
    return "amber" if value >= amber else "green"


def worst(*statuses: Status) -> Status:
    return max(statuses, key=SEVERITY.__getitem__)
