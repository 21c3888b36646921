"""A what-if sweep's progress, in requests replayed across its points: each worker process
reports its point's requests as they are replayed (a few times a second, over a queue), and
the sweep's process adds them up, so that the bar moves within a point and not only when
one ends. A point that ends counts all its requests, whatever of its reports was not read.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from multiprocessing.queues import Queue
from typing import Protocol

REPORT_EVERY_S = 0.25  # how often a worker reports its point's requests replayed

_reports: Queue[tuple[str, int]] | None = None  # the worker's queue to the sweep's process


def start_reporting(reports: Queue[tuple[str, int]]) -> None:
    """In a worker process: report to `reports` from now on."""
    global _reports  # noqa: PLW0603 - one queue per worker process
    _reports = reports


def point_reporter(run: str) -> Callable[[int], None]:
    """In a worker process: the replay's progress callback for the point writing `run`,
    which sends what it counted every REPORT_EVERY_S seconds."""
    counted = 0
    sent_at = time.monotonic()

    def count(requests: int) -> None:
        nonlocal counted, sent_at
        counted += requests
        now = time.monotonic()
        if _reports is not None and now - sent_at >= REPORT_EVERY_S:
            _reports.put((run, counted))
            counted, sent_at = 0, now

    return count


class Reports(Protocol):
    """Where the workers' reports wait: a multiprocessing queue."""

    def get_nowait(self) -> tuple[str, int]: ...


class SweepProgress:
    """The sweep's process's side: the workers' reports passed on to `progress`, each point
    counted up to its `per_point` requests and no further."""

    def __init__(self, per_point: int, progress: Callable[[int], None]) -> None:
        self.per_point = per_point
        self.progress = progress
        self.counted: dict[str, int] = {}
        self.ended: set[str] = set()

    def read(self, reports: Reports) -> None:
        """Pass on every report waiting in `reports`."""
        while True:
            try:
                run, requests = reports.get_nowait()
            except queue.Empty:
                return
            if run not in self.ended:
                self._count(run, requests)

    def ended_point(self, reports: Reports, run: str) -> None:
        """The point writing `run` has ended: count the rest of its requests."""
        self.read(reports)
        self._count(run, self.per_point - self.counted.get(run, 0))
        self.ended.add(run)

    def _count(self, run: str, requests: int) -> None:
        requests = min(requests, self.per_point - self.counted.get(run, 0))
        if requests > 0:
            self.counted[run] = self.counted.get(run, 0) + requests
            self.progress(requests)
