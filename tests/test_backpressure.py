"""A collector that stops taking records for a while (SIGSTOP: a long live refresh, a slow
disk) costs nothing while the engine's backlog holds what it sends; past the backlog's
bound, what is dropped is counted exactly, and the run file records each gap."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.support.engine import (
    collector_process,
    drive,
    recorded_drops,
    stored_record_numbers,
    wait_for,
    workload,
    workload_scheduler,
)

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version


def run_with_a_paused_collector(tmp_path: Path, endpoint: str) -> tuple[object, Path]:
    """Drive the workload through vLLM's scheduler with capture on; the collector is stopped
    for the middle third of it (and a second more), then resumed; the last third starts once
    it has caught up, so records stored after any gap show the file where the gap is."""
    run = tmp_path / "run.duckdb"
    rows = workload()
    scheduler = workload_scheduler(tmp_path / "model")
    capture = scheduler.kvscope_capture
    with collector_process(run, endpoint) as process:
        drive(scheduler, rows[:100], per_step=3)
        process.send_signal(signal.SIGSTOP)
        try:
            drive(scheduler, rows[100:200], per_step=3)
            time.sleep(1)  # several of the transport's 50 ms batches wait meanwhile
        finally:
            process.send_signal(signal.SIGCONT)
        wait_for(lambda: capture.transport.num_in_flight == 0)
        drive(scheduler, rows[200:], per_step=3)
        scheduler.shutdown()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    return capture, run


def test_a_paused_collector_costs_nothing_within_the_backlog(
    tmp_path: Path, capture_environment: str
) -> None:
    capture, run = run_with_a_paused_collector(tmp_path, capture_environment)
    hooks, transport = capture.hooks, capture.transport  # type: ignore[attr-defined]
    assert hooks.num_lost == 0 and transport.num_dropped == 0
    assert transport.num_delivered == hooks.num_records > 5_000
    assert stored_record_numbers(run) == list(range(hooks.num_records))


def test_past_the_backlogs_bound_every_drop_is_counted(
    tmp_path: Path, capture_environment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSCOPE_MAX_BACKLOG_MB", "0.25")
    capture, run = run_with_a_paused_collector(tmp_path, capture_environment)
    hooks, transport = capture.hooks, capture.transport  # type: ignore[attr-defined]
    stored = stored_record_numbers(run)
    assert transport.num_dropped > 0, "a 256 KiB backlog must overflow while the collector sleeps"
    assert hooks.num_lost == 0
    assert len(stored) + transport.num_dropped == hooks.num_records
    assert transport.num_delivered == len(stored)
    assert recorded_drops(run) == transport.num_dropped
