"""Shared fixtures: the Mooncake trace from ../shared, and capture switched on in this process
as an operator would switch it on in an engine. The session runs in a home of its own
(tests/support/private_home.py), entered before any test module is imported."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import private_home
from tests.support.repo import MOONCAKE


def pytest_configure(config: pytest.Config) -> None:
    private_home.enter()


def pytest_unconfigure(config: pytest.Config) -> None:
    private_home.leave()


@pytest.fixture(scope="session")
def mooncake_trace() -> Path:
    if not MOONCAKE.is_file():
        pytest.fail(f"the shared Mooncake trace is missing: {MOONCAKE}")
    return MOONCAKE


@pytest.fixture
def capture_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Switch capture on as an operator would, then load vLLM's general plugins."""
    endpoint = f"ipc://{tmp_path}/kvscope.ipc"
    monkeypatch.setenv("KVSCOPE_CAPTURE", "1")
    monkeypatch.setenv("KVSCOPE_ENDPOINT", endpoint)
    monkeypatch.setenv("KVSCOPE_SECRET", "engine-loop-test")
    monkeypatch.setenv("KVSCOPE_FLUSH_TIMEOUT_S", "10")
    from vllm.plugins import load_general_plugins  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    load_general_plugins()
    return endpoint
