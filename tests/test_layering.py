"""Layering: the engine side never loads the collector's or the app's heavy dependencies."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def loaded_modules(statement: str) -> set[str]:
    code = f"import json, sys; {statement}; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    return {name.split(".")[0] for name in json.loads(result.stdout)}


@pytest.mark.parametrize("forbidden", ["duckdb", "streamlit", "plotly", "pandas", "pyarrow"])
def test_engine_hooks_loads_no_collector_or_app_dependency(forbidden: str) -> None:
    assert forbidden not in loaded_modules("import engine_hooks, engine_hooks.hooks")


def test_collector_does_not_load_streamlit() -> None:
    modules = loaded_modules(
        "import collector.cli, collector.replay, collector.store, collector.summary"
    )
    assert "streamlit" not in modules
    assert "plotly" not in modules
