"""Every benchmark script starts: its imports resolve and it prints its usage (the
benchmarks are run by hand, so nothing else would notice one that rotted)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.repo import REPO

SCRIPTS = sorted(
    path.name for path in (REPO / "benchmarks").glob("*.py") if "def main(" in path.read_text()
)


def test_the_benchmarks_are_found() -> None:
    assert {"hooks_overhead.py", "hooks_paired.py", "vllm_kv_events.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_benchmark_prints_its_usage(script: str) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: "), done.stdout


@pytest.mark.slow
def test_page_timing_times_a_page_in_chromium() -> None:
    """benchmarks/page_timing.py on one page of the sample run: it drives a real headless
    Chromium, so the row shows both views drawn (the figures themselves are not judged)."""
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "page_timing.py"),
            "--runs",
            str(REPO / "sample_data" / "run.duckdb"),
            "--pages",
            "overview,requests",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = [
        line.split(" | ") for line in done.stdout.splitlines() if line.startswith("| run.duckdb")
    ]
    assert [row[1] for row in rows] == ["Overview", "Requests"], done.stdout
    for row in rows:
        cold, warm, verdict = float(row[2]), float(row[3]), row[5]
        assert cold > 0 and warm > 0 and verdict in {"PASS", "MISS"}, row
