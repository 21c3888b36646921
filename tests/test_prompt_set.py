"""Prompt sets: templates rendered into request traces that replay as the prompts share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.cli import main
from collector.replay.prompt_set import render_prompt_set, tokenize
from collector.replay.traces import MAX_TOKEN_ID, read_trace
from tests.support.repo import REPO

EXAMPLE = REPO / "docs" / "ci" / "example"


def test_tokenizer_pieces() -> None:
    assert len(tokenize("Current time: 2026-11-29")) == 13  # 2 words, 1 colon, 8 digits, 2 dashes
    assert tokenize("Hello world") == tokenize("Hello world")
    assert tokenize("Hello world, again")[:2] == tokenize("Hello world")
    assert tokenize(" Hello") != tokenize("Hello"), "the leading space is part of the word"
    assert all(1_000 <= token <= MAX_TOKEN_ID for token in tokenize("ünïcode ok? _x_ 42"))
    assert tokenize("") == []


def test_example_prompt_set_renders_into_a_valid_trace(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl.gz"
    argv = ["prompt-trace", str(EXAMPLE / "prompt_set.jsonl"), "--templates"]
    assert main([*argv, str(EXAMPLE / "templates"), "--out", str(trace)]) == 0
    requests = read_trace(trace)
    assert len(requests) == 48
    assert [request.tenant for request in requests[:3]] == ["support", "billing", "support"]
    assert [request.request_id for request in requests[:2]] == ["prompt-0", "prompt-1"]
    assert [request.timestamp_ms for request in requests[:2]] == [0.0, 750.0]
    first, third = requests[0].token_ids, requests[2].token_ids
    assert first is not None and third is not None
    system_prompt = (EXAMPLE / "templates" / "support_system.txt").read_text()
    shared = next(i for i, (a, b) in enumerate(zip(first, third, strict=False)) if a != b)
    # The same system prompt and question header, then the customers' names differ.
    assert shared == len(tokenize(system_prompt + "\n\nCustomer")) > 350


def write_set(tmp_path: Path, *rows: dict[str, object]) -> Path:
    (tmp_path / "templates").mkdir(exist_ok=True)
    (tmp_path / "templates" / "hello.txt").write_text("Hello $name, it is ${day}.")
    path = tmp_path / "set.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_templates_join_and_literal_prompts_pass(tmp_path: Path) -> None:
    path = write_set(
        tmp_path,
        {"template": ["hello.txt", "hello.txt"], "variables": {"name": "Ada", "day": 3}},
        {"prompt": "Hello Ada, it is 3.", "output_length": 5, "tenant": "t", "cache_salt": "s"},
    )
    joined, literal = render_prompt_set(path, tmp_path / "templates")
    assert joined["token_ids"] == tokenize("Hello Ada, it is 3.Hello Ada, it is 3.")
    assert (joined["timestamp"], joined["output_length"]) == (0, 64)
    assert literal == {
        "request_id": "prompt-1",
        "timestamp": 1,
        "token_ids": tokenize("Hello Ada, it is 3."),
        "output_length": 5,
        "tenant": "t",
        "cache_salt": "s",
    }


BAD_ROWS = {
    "missing_variable": (
        {"template": "hello.txt", "variables": {"name": "A"}},
        "template 'hello.txt' needs variable 'day'",
    ),
    "missing_template": ({"template": "bye.txt"}, "template 'bye.txt': cannot read"),
    "escaping_template": ({"template": "../set.jsonl"}, "template '../set.jsonl' is outside"),
    "no_prompt": ({"variables": {}}, "needs 'prompt' (text) or 'template' (a name or names)"),
    "negative_output": (
        {"prompt": "hi", "output_length": -1},
        "'output_length' must be an integer >= 0, got -1",
    ),
    "bad_tenant": ({"prompt": "hi", "tenant": 5}, "'tenant' must be a non-empty string, got 5"),
    "empty_prompt": ({"prompt": ""}, "the prompt is empty"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_bad_rows_name_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    row, reason = BAD_ROWS[case]
    path = write_set(tmp_path, {"prompt": "fine"}, row)
    out = tmp_path / "trace.jsonl"
    argv = ["prompt-trace", str(path), "--templates", str(tmp_path / "templates")]
    assert main([*argv, "--out", str(out)]) == 2
    assert f"{path}:2: {reason}" in capsys.readouterr().err
    assert not out.exists()
