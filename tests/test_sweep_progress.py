"""A what-if sweep's progress in requests: the workers' reports are passed on as they come,
each point counted up to its requests and no further, and a point that ends counts all of
its requests whatever of its reports was not read (collector/replay/sweep_progress.py)."""

from __future__ import annotations

import queue

from collector.replay.sweep_progress import SweepProgress


def test_reports_are_passed_on_and_each_point_counts_its_requests() -> None:
    reports: queue.Queue[tuple[str, int]] = queue.Queue()
    counted: list[int] = []
    progress = SweepProgress(per_point=10, progress=counted.append)
    reports.put(("a.duckdb", 3))
    reports.put(("b.duckdb", 4))
    progress.read(reports)
    assert counted == [3, 4]  # within the points, before either ends
    reports.put(("a.duckdb", 9))  # more than the point has left: counted up to its 10
    progress.read(reports)
    assert counted == [3, 4, 7]
    progress.ended_point(reports, "b.duckdb")  # its last report was never sent
    assert counted == [3, 4, 7, 6]
    reports.put(("b.duckdb", 2))  # a report read after its point ended counts nothing
    progress.ended_point(reports, "a.duckdb")
    assert sum(counted) == 20
