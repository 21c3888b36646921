"""A run's calendar: its record times as wall-clock dates and times, its days, and the windows
a long run is read by (the last 24 h, the 24 h before, each calendar day).

Records carry the engine's monotonic clock (a replay: the trace's), seconds from the run's
first record; the run's `started_at` (UTC) anchors the first record to the wall clock (exact
for a replay, whose trace time starts at the replay's start; a live capture's first record
comes a little after its collector started). A calendar day is the whole buckets of the
run's grid inside it, so it is a `TimeWindow` every page counts exactly
(collector/model/time_window.py); the last 24 h is the nearest whole number of buckets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from collector.model.time_window import TimeGrid, TimeWindow

DAY_S = 86_400.0
WHOLE_RUN = "the whole run"
LAST_DAY = "the last 24 h"
DAY_BEFORE = "the 24 h before"


@dataclass(frozen=True)
class RunCalendar:
    """The grid of a run whose first record happened at `started_at` (UTC, naive)."""

    grid: TimeGrid
    started_at: datetime

    @property
    def is_multi_day(self) -> bool:
        """Whether the run spans more than a day (and a day picker makes sense)."""
        return self.grid.span_s > DAY_S

    def wall(self, seconds: float) -> datetime:
        """The wall time `seconds` after the run's first record."""
        return self.started_at + timedelta(seconds=seconds)

    def snapped(self, seconds: float, up: bool) -> float:
        """The bucket boundary at or after (`up`) or at or before `seconds`, inside the run."""
        buckets = seconds / self.grid.bucket_s
        whole = math.ceil(buckets - 1e-9) if up else math.floor(buckets + 1e-9)
        return min(max(whole, 0), self.grid.last_bucket + 1) * self.grid.bucket_s

    def day_buckets(self) -> int:
        """How many buckets make a day (the nearest whole number)."""
        return max(round(DAY_S / self.grid.bucket_s), 1)

    def ranges(self) -> dict[str, tuple[float, float]]:
        """The ranges a day picker offers (seconds from the first record, bucket-aligned):
        the whole run, the last 24 h, the 24 h before (if the run reaches back that far),
        and each calendar day (UTC) the run touches, labelled by its date: its whole buckets
        (a day's first and last minutes may fall in buckets it shares with the days beside
        it, left out so the day holds none of theirs)."""
        span = self.grid.span_s
        day = self.day_buckets() * self.grid.bucket_s
        offered = {WHOLE_RUN: (0.0, span), LAST_DAY: (max(span - day, 0.0), span)}
        if span - 2 * day >= 0:
            offered[DAY_BEFORE] = (span - 2 * day, span - day)
        midnight = datetime.combine(self.started_at.date(), datetime.min.time())
        while (midnight - self.started_at).total_seconds() < span:
            start = self.snapped((midnight - self.started_at).total_seconds(), up=True)
            end = self.snapped(
                (midnight + timedelta(days=1) - self.started_at).total_seconds(), up=False
            )
            if end > start:
                offered[midnight.strftime("%a %d %b %Y")] = (start, end)
            midnight += timedelta(days=1)
        return offered

    def before(self, window: TimeWindow) -> tuple[TimeWindow, TimeWindow] | None:
        """The window to compare and the same number of buckets just before it: for the
        whole run, its last 24 h and the 24 h before. None when the run does not reach back
        that far."""
        current = window
        if window.is_whole_run:
            last = self.grid.last_bucket
            current = self.grid.buckets(last - self.day_buckets() + 1, last)
        first = current.first_bucket - current.num_buckets
        if first < 0:
            return None
        return current, self.grid.buckets(first, current.first_bucket - 1)

    def span_words(self, start_s: float, end_s: float) -> str:
        """A range in wall times, e.g. "Fri 04 Dec 10:00 to Sat 05 Dec 10:00 UTC"."""
        start, end = self.wall(start_s), self.wall(end_s)
        same_day = start.date() == end.date()
        shown = (
            f"{start:%a %d %b %H:%M} to {end:%H:%M}"
            if same_day
            else (f"{start:%a %d %b %H:%M} to {end:%a %d %b %H:%M}")
        )
        return f"{shown} UTC"
