"""The house rules as tests: ruff (lint and format) and mypy are clean, and no source module
or function is larger than a reader holds at once."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from tests.support.repo import REPO


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        ["mypy"],
    ],
    ids=["ruff-check", "ruff-format", "mypy"],
)
def test_tool_is_clean(command: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", *command], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


SOURCE_PACKAGES = ("collector", "visualizer", "engine_hooks")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def test_no_source_module_or_function_is_too_long() -> None:
    too_long = []
    for package in SOURCE_PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            name = path.relative_to(REPO)
            text = path.read_text()
            if (lines := len(text.splitlines())) > MAX_MODULE_LINES:
                too_long.append(f"{name}: {lines} lines")
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    assert node.end_lineno is not None
                    if (lines := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                        too_long.append(f"{name}:{node.lineno} {node.name}: {lines} lines")
    assert not too_long, (
        f"over {MAX_MODULE_LINES} lines a module or {MAX_FUNCTION_LINES} a function:\n"
        + "\n".join(too_long)
    )
