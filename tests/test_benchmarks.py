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
