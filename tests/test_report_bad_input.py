"""`kvscope report` on bad input: exit code 2, a message naming the file and reason, and
no report (nor replayed run) left behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from collector.cli import main
from collector.store.schema import SCHEMA_VERSION
from tests.support.repo import REPO, SAMPLE_RUN

GOOD_ROW = {"timestamp": 0, "token_ids": list(range(1, 40)), "output_length": 2}
BAD_THRESHOLDS = {
    "unknown_key": (
        "[token_hit_ratio]\nmax_drop = 0.05\nmax_dorp = 0.1\n",
        "unknown key 'token_hit_ratio.max_dorp'; [token_hit_ratio] takes enabled, max_drop, min",
    ),
    "unknown_section": (
        "[hit_ratio]\nmax_drop = 0.05\n",
        "unknown key 'hit_ratio'; known sections: token_hit_ratio, block_hit_ratio",
    ),
    "collisions_cannot_be_loosened": ("[collisions]\nmax = 3\n", "unknown key 'collisions'"),
    "string": (
        "[tokens_saved]\nmax_relative_drop = 'lots'\n",
        "'tokens_saved.max_relative_drop' must be a number, got 'lots'",
    ),
    "fractional_count": (
        "[dropped_events]\nmax = 1.5\n",
        "'dropped_events.max' must be an integer, got 1.5",
    ),
    "negative": (
        "[eviction_regret]\nmax_increase = -0.1\n",
        "'eviction_regret.max_increase' must be >= 0, got -0.1",
    ),
    "number_for_a_switch": (
        "[min_free_blocks]\nenabled = 1\n",
        "'min_free_blocks.enabled' must be true or false, got 1",
    ),
    "not_a_table": (
        "token_hit_ratio = 0.5\n",
        "'token_hit_ratio' must be a table ([token_hit_ratio])",
    ),
    "syntax": ("[token_hit_ratio\n", "not valid TOML: "),
}


def report(tmp_path: Path, baseline: Path, candidate: Path, *options: str) -> int:
    argv = ["report", "--baseline", str(baseline), "--candidate", str(candidate)]
    return main([*argv, "--out-dir", str(tmp_path / "out"), *options])


def test_missing_input_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.duckdb"
    assert report(tmp_path, SAMPLE_RUN, missing) == 2
    assert f"{missing}: no such file (the --candidate input)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_run_of_another_schema_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = tmp_path / "old.duckdb"
    with duckdb.connect(str(old)) as connection:
        connection.execute("CREATE TABLE meta (key VARCHAR, value VARCHAR)")
        connection.execute(
            "INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION - 1)]
        )
    assert report(tmp_path, old, SAMPLE_RUN) == 2
    expected = f"{old}: run schema version {SCHEMA_VERSION - 1}, this kvscope reads version "
    assert expected + str(SCHEMA_VERSION) in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", sorted(BAD_THRESHOLDS))
def test_bad_thresholds_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    text, message = BAD_THRESHOLDS[case]
    thresholds = tmp_path / "thresholds.toml"
    thresholds.write_text(text)
    assert report(tmp_path, SAMPLE_RUN, SAMPLE_RUN, "--thresholds", str(thresholds)) == 2
    assert f"kvscope: error: {thresholds}: {message}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_missing_thresholds_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "none.toml"
    assert report(tmp_path, SAMPLE_RUN, SAMPLE_RUN, "--thresholds", str(missing)) == 2
    assert f"{missing}: no such thresholds file" in capsys.readouterr().err


def test_bad_candidate_trace_leaves_no_replayed_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text(json.dumps(GOOD_ROW) + "\n")
    bad.write_text(json.dumps(GOOD_ROW) + "\n" + '{"timestamp": 1, "token_ids": [1, -2]}\n')
    assert report(tmp_path, good, bad, "--num-blocks", "64") == 2
    assert f"{bad}:2: 'token_ids'[1] must be a non-negative integer, got -2" in (
        capsys.readouterr().err
    )
    assert list((tmp_path / "out").iterdir()) == [], "the baseline replay was removed"


def test_replay_would_overwrite_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(json.dumps(GOOD_ROW) + "\n")
    (tmp_path / "out").mkdir()
    existing = tmp_path / "out" / "candidate.duckdb"
    existing.write_bytes(b"precious")
    assert report(tmp_path, trace, trace, "--num-blocks", "64") == 2
    assert f"{existing}: already exists; kvscope does not overwrite runs" in (
        capsys.readouterr().err
    )
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["candidate.duckdb"]
    assert existing.read_bytes() == b"precious"


def run_report(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "collector.cli", "report", *arguments],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )


def test_exit_codes_from_the_installed_command(tmp_path: Path) -> None:
    """0, 1 and 2 reach the shell as they are (CI reads them); a floor makes a regression."""
    runs = ["--baseline", str(SAMPLE_RUN), "--candidate", str(SAMPLE_RUN)]
    out = ["--out-dir", str(tmp_path)]
    passing = run_report(*runs, *out)
    assert passing.returncode == 0, passing.stderr
    floor = tmp_path / "floor.toml"
    floor.write_text("[token_hit_ratio]\nmin = 0.99\n")
    regressed = run_report(*runs, *out, "--thresholds", str(floor))
    assert regressed.returncode == 1, regressed.stderr
    assert "regression: token_hit_ratio\n" in regressed.stdout
    gone = tmp_path / "gone.duckdb"
    missing = run_report("--baseline", str(SAMPLE_RUN), "--candidate", str(gone), *out)
    assert missing.returncode == 2
    assert f"{gone}: no such file (the --candidate input)" in missing.stderr
