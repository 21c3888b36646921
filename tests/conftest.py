"""Shared fixtures: the Mooncake trace from ../shared, and capture switched on in this process
as an operator would switch it on in an engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.repo import MOONCAKE


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
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    return endpoint
