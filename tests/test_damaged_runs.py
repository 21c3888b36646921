"""Damaged and foreign run files and datasets (tests/support/damage.py): every command that
opens a run exits 2 with one line naming the file and the damage, writing nothing; the app
says it cannot show that run, and goes on showing the good run beside it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

from collector.store import integrity
from collector.store.run_file import RUN_TABLES, RunFile, StoreError
from tests.support.app import metrics, start
from tests.support.damage import DAMAGE, RUN_FILE_DAMAGE, damaged_copy, scribbled_block
from tests.support.repo import REPO, SAMPLE_RUN
from tests.support.runs import shared_prefix_run
from visualizer.pages import PAGES


def kvscope(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "collector.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


# Each command that opens a run: {run} is the damaged run, what it writes goes to {out}
# ({scratch}: a private folder for a collector's socket).
COMMANDS = {
    "summary": "summary {run}",
    "explain": "explain {run}",
    "advise": "advise {run}",
    "report (candidate)": "report --baseline {sample} --candidate {run} --out-dir {out}",
    "report (baseline)": "report --baseline {run} --candidate {sample} --out-dir {out}",
    "whatif": "whatif {run} --out {out} --limit 2 --num-blocks 2000 --quiet",
    "export": "export {run} --parquet {out}",
    "names": "names {run} --names {readme}",
    "finish": "finish {run}",
    "collect": "collect --db {run} --endpoint ipc://{scratch}/kvscope.ipc --idle-exit 1",
}
WRITES_RUN_FILES = ("finish", "collect")  # they refuse a dataset as a folder


def files_in(folder: Path) -> dict[Path, tuple[int, int]]:
    return {path: (path.stat().st_size, path.stat().st_mtime_ns) for path in folder.rglob("*")}


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """A damaged copy of the sample per case, made once (commands only read it)."""
    made: dict[str, Path] = {}

    def copy(case: str) -> Path:
        if case not in made:
            made[case] = damaged_copy(case, tmp_path_factory.mktemp("damaged"))
        return made[case]

    return copy


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_every_command_refuses_the_damage_in_one_line_naming_the_file(
    case: str, command: str, damaged: Callable[[str], Path], tmp_path: Path
) -> None:
    path = damaged(case)
    if command in WRITES_RUN_FILES and path.is_dir():
        pytest.skip(f"{command} writes run files only; a dataset is refused as a folder")
    out = tmp_path / "out"
    before = files_in(path.parent)
    places = {"run": path, "out": out, "scratch": tmp_path, "sample": SAMPLE_RUN}
    places["readme"] = REPO / "README.md"
    result = kvscope(*[word.format(**places) for word in COMMANDS[command].split()])
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith(f"kvscope: error: {path}: "), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr  # one line, no traceback
    assert DAMAGE[case].reason in result.stderr
    assert not out.exists(), "nothing written"
    assert files_in(path.parent) == before, "the damaged run left as it was"


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_the_app_refuses_the_damaged_run_and_shows_the_good_one_beside_it(
    case: str, tmp_path: Path
) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    path = damaged_copy(case, tmp_path)
    bad = path.rename(folder / f"a_damaged{path.suffix}")  # first in the folder: opened first
    shutil.copy(SAMPLE_RUN, folder / "b_good.duckdb")
    app = start(folder)
    assert app.session_state["run_path"] == str(bad)
    errors = " ".join(error.value for error in app.error)
    assert f"Cannot show this run. {bad}: " in errors and DAMAGE[case].reason in errors
    picker = app.selectbox(key="run_picker")
    assert picker.options[1] == "b_good.duckdb"
    assert picker.options[0].startswith(f"{bad.name} (not a run: ")
    assert DAMAGE[case].reason in picker.options[0]
    picker.select(str(folder / "b_good.duckdb")).run()
    assert not app.exception and not app.error, (app.exception, app.error)
    assert metrics(app)["Requests"] == "500"


@pytest.mark.parametrize("case", sorted(RUN_FILE_DAMAGE))
def test_every_page_says_it_cannot_show_the_run(case: str, tmp_path: Path) -> None:
    path = damaged_copy(case, tmp_path)
    app = start(path)
    for page in [page.path for page in PAGES]:
        app.switch_page(page)
        app.run()
        assert not app.exception, (page, app.exception)
        errors = " ".join(error.value for error in app.error)
        assert DAMAGE[case].reason in errors, (page, errors)


def test_a_large_file_is_checked_by_the_queries_that_read_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above FULL_CHECK_BYTES opening reads no block; DuckDB checks each block a query reads,
    and the damage it meets is refused as opening refuses it."""
    path = tmp_path / "run.duckdb"
    scribbled_block("events")(path)
    with pytest.raises(StoreError, match=r"block 9 \(table events\) does not match its checksum"):
        RunFile.open(path)
    monkeypatch.setattr(integrity, "FULL_CHECK_BYTES", path.stat().st_size - 1)
    with RunFile.open(path) as run:
        assert run.row("SELECT count(*) FROM requests") == (500,)  # blocks undamaged
        with pytest.raises(StoreError) as refused:
            run.frame("SELECT * FROM events")
    assert str(refused.value).startswith(f"{path}: the run is damaged where a query read it: ")
    assert "Corrupt database file" in str(refused.value)


@pytest.mark.vllm
def test_a_finished_run_records_what_it_holds_and_is_held_to_it(tmp_path: Path) -> None:
    run = shared_prefix_run(tmp_path)  # a replay, finalized
    with RunFile.open(run) as opened:
        row = opened.row("SELECT value FROM meta WHERE key = 'contents'")
        assert row is not None
        recorded = json.loads(row[0])
        assert set(recorded) == RUN_TABLES - {"meta"}  # meta holds the record itself
        for table, count in recorded.items():
            assert opened.row(f"SELECT count(*) FROM {table}") == (count,), table
    assert recorded["requests"] == 4
    with duckdb.connect(str(run)) as connection:
        connection.execute("DELETE FROM requests WHERE request_id = 'a1'")
    with pytest.raises(StoreError, match="requests: 3 rows where the run recorded 4 at its end"):
        RunFile.open(run)


def test_the_app_says_so_when_a_page_meets_damage_opening_did_not_look_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "run.duckdb"
    scribbled_block("events")(path)
    monkeypatch.setattr(integrity, "FULL_CHECK_BYTES", path.stat().st_size - 1)
    app = start(path)
    met = 0
    for page in [page.path for page in PAGES]:
        app.switch_page(page)
        app.run()
        assert not app.exception, (page, app.exception)
        errors = " ".join(error.value for error in app.error)
        met += f"{path}: the run is damaged where a query read it" in errors
    assert met, "a page reads the damaged block"
