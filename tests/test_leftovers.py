"""Temporary files of interrupted commands (collector/store/leftovers.py): a replay killed
mid-run leaves `.RUN.duckdb.tmp-PID`; no command reads it as a run, the app does not offer
it, and the next command writing a run into that folder removes it (its process is gone),
keeping those of commands still running and other tools' files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from collector.store.leftovers import leftover, remove_leftovers
from tests.support.app import start
from tests.support.engine import wait_for
from tests.support.repo import REPO, SAMPLE_TRACE


def kvscope(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "collector.cli", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )


def a_gone_process() -> int:
    """The number of a process that ran and is gone."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(done.stdout)


def killed_replay(out: Path) -> Path:
    """Start a replay into `out`, SIGKILL it once its run file is being written; what it left."""
    command = f"replay {SAMPLE_TRACE} --out {out} --timing sequential --quiet"
    replay = subprocess.Popen(
        [sys.executable, "-m", "collector.cli", *command.split()],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    temporary = out.with_name(f".{out.name}.tmp-{replay.pid}")
    wait_for(temporary.exists)
    replay.send_signal(signal.SIGKILL)
    assert replay.wait(timeout=60) == -signal.SIGKILL
    assert not out.exists()
    return temporary


@pytest.mark.vllm
def test_a_killed_replays_run_is_read_by_nothing_and_removed_by_the_next(tmp_path: Path) -> None:
    out = tmp_path / "run.duckdb"
    temporary = killed_replay(out)
    commands = [
        ["summary", temporary],
        ["advise", temporary],
        ["export", temporary, "--parquet", tmp_path / "dataset"],
    ]
    for command in commands:
        result = kvscope(*command)
        assert result.returncode == 2, (command, result.stdout)
        assert result.stderr == (
            f"kvscope: error: {temporary}: a temporary file of a kvscope command writing "
            f"run.duckdb (process {temporary.name.rsplit('-', 1)[1]}, interrupted: it is no "
            "longer running), not a run\n"
        )
    app = start(temporary)  # named on the command line: said why not shown
    assert "a temporary file of a kvscope command" in app.error[0].value
    app.text_input(key="run_folder").input(str(tmp_path)).run()
    assert "No .duckdb runs" in " ".join(warning.value for warning in app.sidebar.warning)
    running = tmp_path / f".other.duckdb.tmp-{os.getpid()}"  # a replay still writing
    running.write_bytes(b"")
    notes = tmp_path / f".notes.txt.tmp-{a_gone_process()}"  # another tool's
    notes.write_bytes(b"")
    assert kvscope("replay", SAMPLE_TRACE, "--out", out, "--limit", "5", "--quiet").returncode == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        [running.name, notes.name, "run.duckdb"]
    )


def test_what_counts_as_a_leftover_and_what_is_removed(tmp_path: Path) -> None:
    gone = a_gone_process()
    names = {  # name: (a kvscope temporary file, removed)
        f".run.duckdb.tmp-{gone}": (True, True),
        f".run.duckdb.tmp-{gone}.wal": (True, True),  # DuckDB's, beside it
        f"..run.duckdb.tmp-{gone}.creating-{gone}": (True, True),  # its schema, being made
        f".run.duckdb.creating-{gone}": (True, True),
        f".dataset.exporting-{gone}": (True, True),
        f".run.duckdb.tmp-{os.getpid()}": (True, False),  # still running
        f".whatif.json.tmp-{gone}": (False, False),  # no run
        f"run.duckdb.tmp-{gone}": (False, False),  # no hidden name: not kvscope's
        ".run.duckdb.live.tmp": (False, False),  # the collector's own (live_copy.py)
    }
    for name in names:
        (tmp_path / name).write_bytes(b"")
    found = {name: (leftover(tmp_path / name) is not None, False) for name in names}
    for path in remove_leftovers(tmp_path):
        found[path.name] = (found[path.name][0], True)
    assert found == names
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        name for name, (_, removed) in names.items() if not removed
    )
