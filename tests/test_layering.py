"""Layering: the engine side never loads the collector's or the app's heavy dependencies,
and inside the collector and the app each folder keeps to its own job:
store (DuckDB) <- queries (SQL) <- advisor, report, views; model/ is pure code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support.modules import loaded_modules
from tests.support.repo import REPO


@pytest.mark.parametrize("forbidden", ["duckdb", "streamlit", "plotly", "pandas", "pyarrow"])
def test_engine_hooks_loads_no_collector_or_app_dependency(forbidden: str) -> None:
    assert forbidden not in loaded_modules("import engine_hooks, engine_hooks.hooks")


def test_collector_does_not_load_streamlit() -> None:
    modules = loaded_modules(
        "import collector.cli, collector.replay.replayer, collector.store, "
        "collector.queries.summary"
    )
    assert "streamlit" not in modules
    assert "plotly" not in modules


ROOT = REPO


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at the top, inside functions or for type checking."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def sources(*folders: str) -> list[Path]:
    return sorted(path for folder in folders for path in (ROOT / folder).rglob("*.py"))


def offenders(files: list[Path], forbidden: str) -> list[str]:
    """`file: module` for each import of a module under one of the `forbidden` prefixes."""
    pattern = re.compile(rf"^({forbidden})(\.|$)")
    return [
        f"{path.relative_to(ROOT)}: {module}"
        for path in files
        for module in sorted(imported_modules(path))
        if pattern.match(module)
    ]


def test_only_the_store_touches_duckdb() -> None:
    outside = [
        path
        for path in sources("collector", "visualizer", "engine_hooks")
        if ROOT / "collector" / "store" not in path.parents
    ]
    assert offenders(outside, "duckdb") == []


def test_queries_read_through_the_store_and_serve_the_rest() -> None:
    files = sources("collector/queries")
    assert files
    upward = "collector\\.(advisor|report|live|commands|cli)|visualizer|streamlit|plotly"
    assert offenders(files, upward) == []


def test_the_store_knows_no_reader() -> None:
    upward = "collector\\.(queries|model|advisor|report|live|replay|commands)|visualizer"
    assert offenders(sources("collector/store"), upward) == []


def test_model_is_pure() -> None:
    assert offenders(sources("collector/model"), "duckdb|collector\\.(store|queries)") == []


def test_advice_reports_and_pages_read_through_queries() -> None:
    """They may name the run file (`RunFile`) but not its tables' making."""
    files = sources("collector/advisor", "collector/report", "visualizer")
    low = "collector\\.store\\.(schema|ingest|rollups)|duckdb"
    assert offenders(files, low) == []


SQL = re.compile(r"\b(SELECT|INSERT|CREATE)\b[\s\S]*\b(FROM|INTO|TABLE)\b")
READS = frozenset({"rows", "row", "record", "frame"})


def sql_in(path: Path) -> list[str]:
    """Lines of a file holding SQL text, or reading a run file (`run.frame(...)`) directly."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        text = node.value if isinstance(node, ast.Constant) else None
        if isinstance(text, str) and SQL.search(text):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
        if isinstance(node, ast.Attribute) and node.attr in READS:
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id == "run":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} run.{node.attr}")
    return found


def test_sql_lives_only_in_the_collector() -> None:
    """No SQL text and no run-file reads in the app: pages call the query modules."""
    assert [line for path in sources("visualizer") for line in sql_in(path)] == []
    assert sql_in(ROOT / "collector" / "queries" / "pool.py")  # the check does see SQL
