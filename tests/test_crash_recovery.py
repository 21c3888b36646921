"""A collector killed with SIGKILL: restarted on its run file it goes on where it stopped, or
`kvscope finish` finishes the file; nothing produced is lost without being counted; the app
warns about a run that was never finished."""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import streamlit as st

from collector.queries.summary import run_summary
from collector.store.run_file import RunStore, live_copy_path
from tests.support.app import start
from tests.support.engine import (
    KILL_AFTER_STEPS,
    collector_process,
    drive,
    kill_collector_mid_run,
    recorded_drops,
    stored_record_numbers,
    workload,
    workload_scheduler,
)
from tests.support.repo import REPO

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version


def kill_mid_run(run: Path, endpoint: str, scheduler: object, rows: list[dict[str, object]]) -> int:
    """Drive the first steps with a collector, kill it once it stored something; the number
    of rows handed to the engine."""
    with collector_process(run, endpoint) as process:
        kill_collector_mid_run(process, scheduler, rows, settle_s=1)  # a live copy exists too
    return KILL_AFTER_STEPS * 3


def stored_and_gaps(run: Path) -> tuple[int, int, int]:
    """Records the file holds, the highest record number, and the drops it records."""
    numbers = stored_record_numbers(run)
    return len(numbers), numbers[-1], recorded_drops(run)


def test_a_killed_collector_restarted_on_its_file_goes_on(
    tmp_path: Path, capture_environment: str
) -> None:
    run = tmp_path / "run.duckdb"
    rows = workload()
    scheduler = workload_scheduler(tmp_path / "model")
    capture = scheduler.kvscope_capture
    handed = kill_mid_run(run, capture_environment, scheduler, rows)
    drive(scheduler, rows[handed : handed + 60], per_step=3)  # no collector now
    with collector_process(run, capture_environment) as process:
        drive(scheduler, rows[handed + 60 :], per_step=3)
        scheduler.shutdown()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    hooks, transport = capture.hooks, capture.transport
    stored, highest, recorded_drops = stored_and_gaps(run)
    counted_lost = hooks.num_lost + transport.num_dropped
    missing = hooks.num_records - stored
    assert 0 <= missing <= counted_lost, "every record not stored is counted by the engine"
    assert recorded_drops == highest + 1 - stored, "the file records each gap it holds"
    assert highest == hooks.num_records - 1, "the engine's last records arrived after resuming"
    store = RunStore.open(run)
    summary = run_summary(store)
    assert store.finished and summary["requests"] == len(rows)
    store.close()
    assert not live_copy_path(run).exists()


def test_kvscope_finish_finishes_a_killed_run_and_the_app_warns_until_then(
    tmp_path: Path, capture_environment: str
) -> None:
    run = tmp_path / "run.duckdb"
    scheduler = workload_scheduler(tmp_path / "model")
    kill_mid_run(run, capture_environment, scheduler, workload())
    scheduler.shutdown()
    assert live_copy_path(run).exists(), "the killed collector left its live copy"

    def overview_warnings() -> str:
        app = start(run)
        st.cache_resource.clear()  # the app's read run_file, so that `finish` may write
        gc.collect()
        return " ".join(warning.value for warning in app.warning)

    assert "was not finished" in overview_warnings()
    finish = [sys.executable, "-m", "collector.cli", "finish", str(run)]
    result = subprocess.run(finish, cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "finished:" in result.stdout
    assert not live_copy_path(run).exists()
    assert "was not finished" not in overview_warnings()
    store = RunStore.open(run)
    assert store.finished and run_summary(store)["requests"] > 0
    store.close()
    again = subprocess.run(finish, cwd=REPO, capture_output=True, text=True, check=False)
    assert again.returncode == 2 and "a finished run" in again.stderr
