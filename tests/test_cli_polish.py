"""The command line as a new user meets it: every option of every `kvscope` command says
what it does in `--help`, `replay`'s progress bar times the replay, not vLLM's start, and
vLLM's import warnings stay off the terminal."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path

from tqdm import tqdm

from collector.cli import build_parser
from collector.commands.replay import timed


def commands() -> dict[str, argparse.ArgumentParser]:
    (action,) = [
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    ]
    return dict(action.choices)


def test_every_option_has_help() -> None:
    silent = [
        f"{name} {'/'.join(action.option_strings) or action.dest}"
        for name, command in commands().items()
        for action in command._actions
        if not action.help and not isinstance(action, argparse._HelpAction)
    ]
    assert silent == []


def test_generate_says_its_defaults_make_the_sample() -> None:
    help_text = " ".join(commands()["generate"].format_help().split())
    assert "The defaults reproduce the committed sample" in help_text
    assert "random seed (7: the committed sample's)" in help_text


def test_the_replay_bar_starts_at_the_first_request() -> None:
    bar = tqdm(total=10, file=io.StringIO(), disable=False, desc="starting vLLM")
    bar.start_t = 0.0  # as if vLLM took since 1970 to start
    update = timed(bar)
    update(1)
    update(2)
    # The bar was reset at the first request: its clock and count start there.
    assert (bar.n, bar.desc) == (3, "replaying: ")
    assert bar.start_t > 0
    bar.close()


def test_a_replay_prints_none_of_vllms_import_noise(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "".join(
            json.dumps(
                {"timestamp": i, "input_length": 1024, "output_length": 4, "hash_ids": [1, i]}
            )
            + "\n"
            for i in range(3)
        )
    )
    replay = subprocess.run(
        [
            sys.executable,
            "-m",
            "collector.cli",
            "replay",
            str(trace),
            "--out",
            str(tmp_path / "run.duckdb"),
            "--block-size",
            "32",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert replay.returncode == 0, replay.stderr
    assert (tmp_path / "run.duckdb").exists()
    # vLLM warns that this build lacks its compiled kernels ("Failed to import from
    # vllm._C"), which a replay never uses: kvscope keeps it, and torch's, off the terminal.
    assert "Failed to import" not in replay.stderr
    assert "deprecated" not in replay.stderr
