"""The repository's own files the tests read, and the fixed pseudonym key of test runs."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MOONCAKE = Path(os.environ.get("KVSCOPE_SHARED", REPO.parent / "shared")) / (
    "traces/mooncake/synthetic_trace.jsonl"
)
SAMPLE_TRACE = REPO / "sample_data" / "trace.jsonl.gz"
SAMPLE_RUN = REPO / "sample_data" / "run.duckdb"
SAMPLE_HYBRID_RUN = REPO / "sample_data" / "run_hybrid.duckdb"
SECRET = b"kvscope-tests"
