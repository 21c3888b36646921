"""Bad input: a clear error naming the file, line and reason, exit code 2, nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from collector.cli import main
from collector.store.schema import SCHEMA_VERSION

GOOD = '{"timestamp": 0, "input_length": 1000, "output_length": 4, "hash_ids": [1, 2]}'

BAD_LINES = {
    "bad_json": ('{"timestamp": 0, "input_length": 10,', "invalid JSON"),
    "missing_field": (
        '{"timestamp": 0, "output_length": 4, "hash_ids": [1]}',
        "missing field 'input_length'",
    ),
    "negative_length": (
        '{"timestamp": 0, "input_length": 10, "output_length": -3, "hash_ids": [1]}',
        "'output_length' must be from 0 to 16777216, got -3",
    ),
    "non_integer_token": (
        '{"timestamp": 0, "token_ids": [1, 2, "three"], "output_length": 1}',
        "'token_ids'[2] must be a non-negative integer, got 'three'",
    ),
    "wrong_block_count": (
        '{"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}',
        "'hash_ids' has 2 ids but input_length 1025 needs 3 blocks of 512",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_malformed_trace_is_rejected_with_file_line_and_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    line, reason = BAD_LINES[case]
    trace = tmp_path / "trace.jsonl"
    trace.write_text(f"{GOOD}\n{GOOD.replace('[1, 2]', '[1, 3]')}\n{line}\n")
    out = tmp_path / "run.duckdb"
    code = main(["replay", str(trace), "--out", str(out), "--block-size", "16", "--quiet"])
    error = capsys.readouterr().err
    assert code == 2
    assert f"{trace}:3: " in error
    assert reason in error
    assert list(tmp_path.iterdir()) == [trace], "no run file, no temporary file"


def test_exit_code_is_2_from_the_installed_command(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("not json\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "collector.cli",
            "replay",
            str(trace),
            "--out",
            str(tmp_path / "r.duckdb"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert f"{trace}:1: invalid JSON" in result.stderr
    assert not (tmp_path / "r.duckdb").exists()


def test_request_larger_than_the_cache_names_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        f"{GOOD}\n"
        + '{"timestamp": 1, "token_ids": '
        + str(list(range(200)))
        + ', "output_length": 1}\n'
    )
    code = main(
        [
            "replay",
            str(trace),
            "--out",
            str(tmp_path / "r.duckdb"),
            "--block-size",
            "16",
            "--num-blocks",
            "8",
            "--quiet",
        ]
    )
    assert code == 2
    assert (
        f"{trace}:1: request req-0 needs more than the 7 usable blocks" in capsys.readouterr().err
    )
    assert list(tmp_path.iterdir()) == [trace]


def test_existing_run_is_not_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(f"{GOOD}\n")
    out = tmp_path / "run.duckdb"
    out.write_bytes(b"precious")
    assert main(["replay", str(trace), "--out", str(out), "--quiet"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert out.read_bytes() == b"precious"


def test_run_of_another_schema_version_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = tmp_path / "old.duckdb"
    with duckdb.connect(str(old)) as connection:
        connection.execute("CREATE TABLE meta (key VARCHAR, value VARCHAR)")
        connection.execute(
            "INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION + 1)]
        )
    assert main(["summary", str(old), "--json"]) == 2
    error = capsys.readouterr().err
    expected = f"run schema version {SCHEMA_VERSION + 1}, this kvscope reads version "
    assert f"{old}: {expected}{SCHEMA_VERSION}" in error


def test_missing_run_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(tmp_path / "nope.duckdb")]) == 2
    assert "no such run file" in capsys.readouterr().err


def test_a_folder_is_not_a_run_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "b.duckdb").write_bytes(b"")
    (tmp_path / "a.duckdb").write_bytes(b"")
    assert main(["summary", str(tmp_path)]) == 2
    assert f"{tmp_path}: a folder, not a run file (its .duckdb files: a.duckdb, b.duckdb)" in (
        capsys.readouterr().err
    )
