"""Damaged and foreign run files: every command exits 2 with the file and the reason, and
every page of the app says it cannot show the run, never a traceback."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

from tests.support.app import start
from tests.support.repo import REPO, SAMPLE_RUN
from visualizer.pages import PAGES


def sqlite_file(path: Path) -> None:
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE t (x)")


def cut_in_half(path: Path) -> None:
    data = SAMPLE_RUN.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def foreign_duckdb(path: Path) -> None:
    with duckdb.connect(str(path)) as connection:
        connection.execute("CREATE TABLE t (x INTEGER)")


def sample_with(statement: str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        shutil.copy(SAMPLE_RUN, path)
        with duckdb.connect(str(path)) as connection:
            connection.execute(statement)

    return damage


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "empty": (lambda path: path.write_bytes(b""), "not a DuckDB file"),
    "random bytes": (lambda path: path.write_bytes(os.urandom(50_000)), "not a DuckDB file"),
    "sqlite": (sqlite_file, "not a DuckDB file"),
    "cut in half": (cut_in_half, "cut short"),
    "foreign duckdb": (foreign_duckdb, "not a kvscope run"),
    "no events table": (sample_with("DROP TABLE events"), "tables missing: events"),
    "no runs row": (sample_with("DELETE FROM runs"), "0 rows in its runs table"),
    "another version": (sample_with("UPDATE meta SET value = '99'"), "schema version 99"),
}


@pytest.fixture(params=sorted(DAMAGE))
def damaged(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, str]:
    make, reason = DAMAGE[request.param]
    path = tmp_path / "run.duckdb"
    make(path)
    return path, reason


def kvscope(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "collector.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_every_command_names_the_file_and_the_damage(
    damaged: tuple[Path, str], tmp_path: Path
) -> None:
    path, reason = damaged
    out = tmp_path / "report"
    for args in (
        ("summary", str(path)),
        ("advise", str(path)),
        ("report", "--baseline", str(SAMPLE_RUN), "--candidate", str(path), "--out-dir", str(out)),
        ("report", "--baseline", str(path), "--candidate", str(SAMPLE_RUN), "--out-dir", str(out)),
    ):
        result = kvscope(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr
        assert f"kvscope: error: {path}" in result.stderr and reason in result.stderr, args
    assert not out.exists()


def test_every_page_says_it_cannot_show_the_run(damaged: tuple[Path, str]) -> None:
    path, reason = damaged
    app = start(path)
    for page in [page.path for page in PAGES]:
        app.switch_page(page)
        app.run()
        assert not app.exception, (page, app.exception)
        errors = " ".join(error.value for error in app.error)
        assert reason in errors, (page, errors)
