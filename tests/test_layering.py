"""Layering: the engine side never loads the collector's or the app's heavy dependencies,
and inside the collector and the app each folder keeps to its own job:
store (DuckDB) <- queries (SQL) <- advisor, report, views; model/ is pure code every layer
reads; vllm_kv/ (vLLM's KV events) sits under both live/ (capture) and replay/, which never
import each other; the collector never imports the app; and no module imports itself back
through others. Every import counts: at the top, inside functions, for type checking."""

from __future__ import annotations

import ast
import itertools
import re
import sys
from collections import deque
from collections.abc import Iterator
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
PACKAGES = ("collector", "visualizer", "engine_hooks")


def module_name(path: Path) -> str:
    """`collector.store.run_file` for collector/store/run_file.py, a package for its __init__."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(tree: ast.Module, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, module) for every import anywhere in a module's tree, relative ones made absolute;
    `from a import b` gives `a.b` (b may be a module; a prefix of it names `a`)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")[: len(module.split(".")) - (not is_package)]
                package = package[: len(package) - node.level + 1]
                base = ".".join([*package, base] if base else package)
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def file_imports(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    return imports(tree, module_name(path), path.name == "__init__.py")


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at the top, inside functions or for type checking."""
    return {module for _, module in file_imports(path)}


def sources(*folders: str) -> list[Path]:
    return sorted(path for folder in folders for path in (ROOT / folder).rglob("*.py"))


def offenders(files: list[Path], forbidden: str) -> list[str]:
    """`file:line: module` for each import of a module under one of the `forbidden` prefixes."""
    pattern = re.compile(rf"^({forbidden})(\.|$)")
    return sorted(
        {
            f"{path.relative_to(ROOT)}:{line}: {module}"
            for path in files
            for line, module in file_imports(path)
            if pattern.match(module)
        }
    )


def test_the_reader_sees_every_import() -> None:
    """At the top, inside a function, under TYPE_CHECKING, relative: all are read."""
    source = """
from typing import TYPE_CHECKING
import json
if TYPE_CHECKING:
    from collector.replay.traces import TraceError
def run() -> None:
    from visualizer.charts import fleet
    from . import sibling
    from ..model.mrc import miss_ratio_curve
"""
    found = {module for _, module in imports(ast.parse(source), "collector.queries.x", False)}
    assert found == {
        "typing.TYPE_CHECKING",
        "json",
        "collector.replay.traces.TraceError",
        "visualizer.charts.fleet",
        "collector.queries.sibling",
        "collector.model.mrc.miss_ratio_curve",
    }


def test_the_collector_never_imports_the_app() -> None:
    assert offenders(sources("collector"), "visualizer|streamlit") == []


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
    upward = "collector\\.(advisor|report|live|replay|commands|cli)|visualizer|streamlit|plotly"
    assert offenders(files, upward) == []


def test_the_store_knows_no_reader() -> None:
    upward = (
        "collector\\.(queries|model|advisor|report|live|replay|commands|charts|vllm_kv|cli)"
        "|visualizer"
    )
    assert offenders(sources("collector/store"), upward) == []


# What model/ may import besides the standard library and itself: the array libraries it
# computes with (no I/O, no SQL, no other kvscope layer).
MODEL_LIBRARIES = frozenset({"numpy", "pandas"})


def test_model_imports_only_the_standard_library_and_itself() -> None:
    files = sources("collector/model")
    assert files
    allowed = sys.stdlib_module_names | MODEL_LIBRARIES
    outside = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in files
        for line, module in file_imports(path)
        if module.split(".")[0] not in allowed and not re.match(r"collector\.model(\.|$)", module)
    ]
    assert outside == []


def test_live_capture_and_replay_never_import_each_other() -> None:
    assert offenders(sources("collector/live"), "collector\\.replay") == []
    assert offenders(sources("collector/replay"), "collector\\.live") == []


def test_vllm_kv_events_sit_below_capture_and_replay() -> None:
    upward = "collector\\.(live|replay|queries|advisor|report|commands|charts|cli)|visualizer"
    assert offenders(sources("collector/vllm_kv"), upward) == []


ImportGraph = dict[str, dict[str, int]]


def import_graph() -> ImportGraph:
    """Each of kvscope's modules -> {kvscope module it imports: the line of its first import}.
    An import names the longest module its dotted name starts with (`from a import b`: `a.b`
    if b is a module, else `a`); a module's own package counts only where it is named."""
    modules = {module_name(path): path for path in sources(*PACKAGES)}
    graph: ImportGraph = {}
    for module, path in modules.items():
        edges: dict[str, int] = {}
        for line, name in file_imports(path):
            target = name
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != module:
                edges.setdefault(target, line)
        graph[module] = edges
    return graph


def circles(graph: ImportGraph) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = {stack.pop()}
            while module not in component:
                component.add(stack.pop())
            if len(component) > 1:
                found.append(component)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def file_of(module: str) -> Path:
    path = ROOT.joinpath(*module.split("."))
    return (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).relative_to(ROOT)


def a_circle(graph: ImportGraph, component: set[str]) -> str:
    """The shortest way from the component's first module back to it, each import's line
    named: `a (a.py:12) -> b (b.py:40) -> a`."""
    start = min(component)
    previous: dict[str, str] = {}
    queue = deque([start])
    while start not in previous:
        module = queue.popleft()
        for target in sorted(set(graph[module]) & component - previous.keys()):
            previous[target] = module
            queue.append(target)
    steps = [start, previous[start]]
    while steps[-1] != start:
        steps.append(previous[steps[-1]])
    steps.reverse()
    hops = [f"{step} ({file_of(step)}:{graph[step][to]})" for step, to in itertools.pairwise(steps)]
    return " -> ".join([*hops, start])


def test_no_module_imports_itself_back() -> None:
    """Imports inside functions included: a circle hidden by a late import is still a circle."""
    graph = import_graph()
    assert "collector.commands.replay" in graph["collector.cli"]  # the graph is read
    found = [a_circle(graph, component) for component in circles(graph)]
    assert not found, "import circles:\n" + "\n".join(found)


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
