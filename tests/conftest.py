"""Shared fixtures: the Mooncake trace from ../shared, a fixed pseudonym key, tiny helpers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MOONCAKE = Path(os.environ.get("KVSCOPE_SHARED", REPO.parent / "shared")) / (
    "traces/mooncake/synthetic_trace.jsonl"
)
SAMPLE_TRACE = REPO / "sample_data" / "trace.jsonl.gz"
SAMPLE_RUN = REPO / "sample_data" / "run.duckdb"
SECRET = b"kvscope-tests"


@pytest.fixture(scope="session")
def mooncake_trace() -> Path:
    if not MOONCAKE.is_file():
        pytest.fail(f"the shared Mooncake trace is missing: {MOONCAKE}")
    return MOONCAKE
