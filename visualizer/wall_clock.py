"""The clock a page's time charts read on: a run longer than a day by its wall-clock dates
and times, UTC ("Tue 14:00", not "250,000 s"); a shorter one by seconds since its first
record, as its captions, the Compare page and a replayed trace's own times count them (a
replay's wall clock is only when it was replayed)."""

from __future__ import annotations

from datetime import datetime

from collector.queries.timeline import run_calendar
from collector.store.run_file import RunFile


def chart_origin(run: RunFile) -> datetime | None:
    """The wall time (UTC) of the run's first record, where its time charts read on the wall
    clock (a run longer than a day); None where they read in seconds."""
    calendar = run_calendar(run)
    return calendar.started_at if calendar.is_multi_day else None
