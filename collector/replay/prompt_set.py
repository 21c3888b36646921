"""Prompt sets: a repository's prompt templates rendered into a kvscope request trace.

A prompt set is JSONL, one request per line:

    {"template": ["system.txt", "question.txt"], "variables": {"question": "..."},
     "timestamp": 0, "output_length": 64, "tenant": "acme"}

`template` names one file, or several joined in order, under the templates directory;
templates use Python's `string.Template` syntax (`$name`, `${name}`); `prompt` may give the
text itself instead. `timestamp`, `output_length`, `request_id`, `tenant`, `lora` and
`cache_salt` mean what they mean in a kvscope trace.

Text becomes token ids through a stand-in tokenizer, deterministic and offline: each word
with its leading space, each digit and each punctuation mark is one token, its id a hash of
its text. Equal text gives equal tokens, so prefix sharing is exactly the prompts' own; token
counts come out near a real BPE tokenizer's for English prose.
"""

from __future__ import annotations

import hashlib
import re
import string
from pathlib import Path
from typing import Any

from collector.replay.traces import MAX_TOKEN_ID, TraceError, parse_json_object

TOKEN_PATTERN = re.compile(r"\s*[^\W\d_]+|\s*\d|\s*[^\w\s]|\s*_|\s+")
FIRST_TOKEN_ID = 1_000
PASSED_THROUGH = ("request_id", "tenant", "lora", "cache_salt")


def tokenize(text: str) -> list[int]:
    """The stand-in tokenizer: one id per word, digit or punctuation mark (spaces attached)."""
    return [_token_id(piece) for piece in TOKEN_PATTERN.findall(text)]


def _token_id(piece: str) -> int:
    digest = hashlib.blake2b(piece.encode(), digest_size=8).digest()
    return FIRST_TOKEN_ID + int.from_bytes(digest, "big") % (MAX_TOKEN_ID - FIRST_TOKEN_ID)


def render_prompt_set(prompt_set: Path, templates: Path) -> list[dict[str, Any]]:
    """Every request of the prompt set as a kvscope trace row."""
    cache: dict[str, string.Template] = {}
    rows: list[dict[str, Any]] = []
    try:
        lines = prompt_set.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise TraceError(prompt_set, 0, f"cannot read: {error}") from error
    for number, text in enumerate(lines, start=1):
        if text.strip():
            row = parse_json_object(prompt_set, number, text)
            prompt = _prompt_text(prompt_set, number, row, templates, cache)
            rows.append(_trace_row(prompt_set, number, row, prompt, len(rows)))
    if not rows:
        raise TraceError(prompt_set, 0, "the prompt set holds no requests")
    return rows


def _prompt_text(
    path: Path,
    line: int,
    row: dict[str, Any],
    templates: Path,
    cache: dict[str, string.Template],
) -> str:
    if isinstance(row.get("prompt"), str):
        return str(row["prompt"])
    names = row.get("template")
    names = [names] if isinstance(names, str) else names
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise TraceError(path, line, "needs 'prompt' (text) or 'template' (a name or names)")
    variables = row.get("variables", {})
    if not isinstance(variables, dict):
        raise TraceError(path, line, "'variables' must be an object")
    parts = []
    for name in names:
        template = cache.get(name) or _load_template(path, line, templates, name)
        cache[name] = template
        try:
            parts.append(template.substitute({key: str(value) for key, value in variables.items()}))
        except KeyError as error:
            raise TraceError(
                path, line, f"template {name!r} needs variable {error.args[0]!r}"
            ) from error
        except ValueError as error:
            raise TraceError(path, line, f"template {name!r}: {error}") from error
    return "".join(parts)


def _load_template(path: Path, line: int, templates: Path, name: str) -> string.Template:
    file = templates / name
    if not file.resolve().is_relative_to(templates.resolve()):
        raise TraceError(path, line, f"template {name!r} is outside {templates}")
    try:
        return string.Template(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise TraceError(path, line, f"template {name!r}: cannot read {file}: {error}") from error


def _trace_row(
    path: Path, line: int, row: dict[str, Any], prompt: str, index: int
) -> dict[str, Any]:
    token_ids = tokenize(prompt)
    if not token_ids:
        raise TraceError(path, line, "the prompt is empty")
    timestamp, output_length = row.get("timestamp", index), row.get("output_length", 64)
    if isinstance(timestamp, bool) or not isinstance(timestamp, int | float) or timestamp < 0:
        raise TraceError(path, line, f"'timestamp' must be a number >= 0, got {timestamp!r}")
    if isinstance(output_length, bool) or not isinstance(output_length, int) or output_length < 0:
        raise TraceError(
            path, line, f"'output_length' must be an integer >= 0, got {output_length!r}"
        )
    trace_row: dict[str, Any] = {
        "request_id": f"prompt-{index}",
        "timestamp": timestamp,
        "token_ids": token_ids,
        "output_length": output_length,
    }
    for key in PASSED_THROUGH:
        value = row.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            raise TraceError(path, line, f"'{key}' must be a non-empty string, got {value!r}")
        if value is not None:
            trace_row[key] = value
    return trace_row
