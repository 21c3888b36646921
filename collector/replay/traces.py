"""Request traces kvscope replays: Mooncake JSONL and kvscope's own request-trace JSONL.

Mooncake (`hash_ids`): one id per 512-token block, prefix-chained. Each id expands into a
deterministic run of 512 token ids (`id * 512 + offset`): equal ids give equal tokens, so
vLLM's own hashing sees equal blocks as equal, and different ids never share a token.

kvscope (`token_ids`): see docs/trace-formats.md, "kvscope's request trace".

Reading holds one line at a time, and a line is bounded before it is parsed: at most
MAX_LINE_BYTES bytes (two lists of MAX_TOKENS token ids of ten digits and a separator each,
the prompt's and the output's, plus 64 KiB for the other fields) and MAX_LINE_VALUES values
(counted by their commas), so a line that could not hold a valid request is refused as soon
as it has been read that far, never held whole: a gzip of one line of gigabytes is refused
after its first MAX_LINE_BYTES. `limit` reads no further than its last request.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from collector.model.trace_request import MOONCAKE_BLOCK_TOKENS, TraceRequest

MAX_TOKEN_ID = 2**31 - 1
MAX_HASH_ID = MAX_TOKEN_ID // MOONCAKE_BLOCK_TOKENS  # its 512 token ids stay valid ids
MAX_TOKENS = 2**24  # prompt or output tokens of one request: far past any model's context
MAX_TIMESTAMP_MS = 10**12  # 31 years after the trace starts; the replay clock is int64 ns
MAX_LABEL_LENGTH = 256
# A line's bounds, from the token limit: its prompt and output token ids, each of up to ten
# digits and ", "; and its values: a list's values after its first follow a comma each.
MAX_LINE_BYTES = 2 * MAX_TOKENS * len(f"{MAX_TOKEN_ID}, ") + 2**16  # 402,718,720
MAX_LINE_VALUES = 2 * MAX_TOKENS + 2**16
# Object members: a trace line has a dozen fields; each member's name ends in `":` (a quote
# inside a string is escaped, so a string's `\":` counts too: never fewer than there are).
MAX_LINE_MEMBERS = 2**16
_MEMBER = re.compile(rb'"[ \t\r\n]*:')
READ_BYTES = 2**20  # a long line is read this much at a time
FORMATS = ("auto", "mooncake", "kvscope")


class TraceError(ValueError):
    """A trace line kvscope cannot replay; the message names the file, line and reason
    (line 0: the whole file, and the message names no line)."""

    def __init__(self, path: Path, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}" if line else f"{path}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason

    def __reduce__(self) -> tuple[type[TraceError], tuple[Path, int, str]]:
        # As it was made (an exception pickles with its message alone by default): a
        # point's replay on a Ray node raises it back to the driver.
        return TraceError, (self.path, self.line, self.reason)


def read_trace(
    path: Path, trace_format: str = "auto", limit: int | None = None
) -> list[TraceRequest]:
    """Read and validate a trace, its first `limit` requests only when given (no line after
    the last of them is read); raise `TraceError` at the first bad line."""
    if trace_format not in FORMATS:
        raise ValueError(f"unknown trace format {trace_format!r}; use one of {FORMATS}")
    requests: list[TraceRequest] = []
    seen_ids: set[str] = set()
    with _open_text(path) as handle:
        for line_number, text in _numbered_lines(path, handle):
            request = _parse_line(path, line_number, text, trace_format, len(requests))
            del text  # before the next line is read
            if request.request_id in seen_ids:
                raise TraceError(path, line_number, f"duplicate request_id {request.request_id!r}")
            seen_ids.add(request.request_id)
            requests.append(request)
            if len(requests) == limit:
                break
    if not requests:
        raise TraceError(path, 0, "the trace holds no requests")
    return requests


def _open_text(path: Path) -> Any:
    """The trace's bytes, gunzipped when its name ends in .gz (lines are decoded one by one,
    so a bad byte is reported on its own line)."""
    try:
        if path.suffix == ".gz":
            return gzip.open(path, "rb")
        return path.open("rb")
    except OSError as error:
        raise TraceError(path, 0, f"cannot open: {error.strerror}") from error


def _numbered_lines(path: Path, handle: Any) -> Iterator[tuple[int, str]]:
    """Each non-blank line's number and text, every line bounded before it is decoded."""
    line_number = 0
    try:
        while raw := _bounded_line(path, line_number + 1, handle):
            line_number += 1
            _check_values(path, line_number, raw)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise TraceError(path, line_number, f"not UTF-8 text: {error.reason}") from None
            del raw  # one copy of a long line at a time
            if text.strip():
                yield line_number, text
            del text
    except (OSError, EOFError, zlib.error) as error:
        raise TraceError(path, line_number + 1, f"cannot read: {error}") from error


def _bounded_line(path: Path, line_number: int, handle: Any) -> bytearray:
    """The next line's bytes (empty at the end), read READ_BYTES at a time; a line longer
    than MAX_LINE_BYTES is refused once that much of it has been read."""
    line = bytearray()
    while piece := handle.readline(READ_BYTES):
        line += piece
        if len(line) - line.endswith(b"\n") > MAX_LINE_BYTES:
            raise TraceError(
                path,
                line_number,
                f"line longer than {MAX_LINE_BYTES:,} bytes, more than a request of "
                f"{MAX_TOKENS:,} prompt and {MAX_TOKENS:,} output tokens takes",
            )
        if line.endswith(b"\n"):
            break
    return line


def _check_values(path: Path, line_number: int, raw: bytearray) -> None:
    """Refuse a line that would parse into more values or object members than a request
    holds, before it is parsed."""
    if raw.count(b",") > MAX_LINE_VALUES:
        raise TraceError(
            path,
            line_number,
            f"more than {MAX_LINE_VALUES:,} values, more than a request of {MAX_TOKENS:,} "
            f"prompt and {MAX_TOKENS:,} output tokens holds",
        )
    for members, _ in enumerate(_MEMBER.finditer(raw), start=1):
        if members > MAX_LINE_MEMBERS:
            raise TraceError(path, line_number, f"more than {MAX_LINE_MEMBERS:,} object members")


def parse_json_object(path: Path, line: int, text: str) -> dict[str, Any]:
    """One JSONL line as a JSON object, or a TraceError naming the file, line and reason."""
    try:
        row = json.loads(text)
    except json.JSONDecodeError as error:
        raise TraceError(
            path, line, f"invalid JSON: {error.msg} at column {error.colno}"
        ) from error
    except RecursionError:
        raise TraceError(path, line, "invalid JSON: nested too deeply") from None
    except ValueError as error:  # e.g. an integer of more than 4,300 digits
        raise TraceError(path, line, f"invalid JSON: {error}") from None
    if not isinstance(row, dict):
        raise TraceError(path, line, f"expected a JSON object, got {type(row).__name__}")
    return row


def _parse_line(path: Path, line: int, text: str, trace_format: str, index: int) -> TraceRequest:
    row = parse_json_object(path, line, text)
    fields = _Fields(path, line, row)
    is_mooncake = "hash_ids" in row if trace_format == "auto" else trace_format == "mooncake"
    if is_mooncake:
        return _mooncake_request(fields, index)
    if trace_format == "auto" and "token_ids" not in row:
        raise TraceError(path, line, "neither 'hash_ids' (Mooncake) nor 'token_ids' (kvscope)")
    return _kvscope_request(fields, index)


def _mooncake_request(fields: _Fields, index: int) -> TraceRequest:
    input_length = fields.integer("input_length", minimum=1, maximum=MAX_TOKENS)
    hash_ids = fields.integer_list(
        "hash_ids", maximum=MAX_HASH_ID, max_length=-(-MAX_TOKENS // MOONCAKE_BLOCK_TOKENS)
    )
    expected = math.ceil(input_length / MOONCAKE_BLOCK_TOKENS)
    if len(hash_ids) != expected:
        fields.fail(
            f"'hash_ids' has {len(hash_ids)} ids but input_length {input_length} needs "
            f"{expected} blocks of {MOONCAKE_BLOCK_TOKENS}"
        )
    return TraceRequest(
        line=fields.line,
        request_id=f"req-{index}",
        timestamp_ms=fields.number("timestamp", minimum=0.0, maximum=MAX_TIMESTAMP_MS),
        num_prompt_tokens=input_length,
        output_length=fields.integer("output_length", minimum=0, maximum=MAX_TOKENS),
        hash_ids=tuple(hash_ids),
    )


def _kvscope_request(fields: _Fields, index: int) -> TraceRequest:
    token_ids = fields.integer_list("token_ids")
    if not token_ids:
        fields.fail("'token_ids' is empty")
    output_length = fields.integer("output_length", minimum=0, maximum=MAX_TOKENS)
    output_token_ids = fields.optional_integer_list("output_token_ids")
    if output_token_ids is not None and len(output_token_ids) != output_length:
        fields.fail(
            f"'output_token_ids' has {len(output_token_ids)} tokens, "
            f"output_length says {output_length}"
        )
    return TraceRequest(
        line=fields.line,
        request_id=fields.optional_string("request_id") or f"req-{index}",
        timestamp_ms=fields.number("timestamp", minimum=0.0, maximum=MAX_TIMESTAMP_MS),
        num_prompt_tokens=len(token_ids),
        output_length=output_length,
        tenant=fields.optional_string("tenant"),
        lora=fields.optional_string("lora"),
        cache_salt=fields.optional_string("cache_salt"),
        token_ids=tuple(token_ids),
        output_token_ids=None if output_token_ids is None else tuple(output_token_ids),
    )


class _Fields:
    """Typed access to one trace object's fields, failing with the file and line."""

    def __init__(self, path: Path, line: int, row: dict[str, Any]) -> None:
        self.path = path
        self.line = line
        self.row = row

    def fail(self, reason: str) -> NoReturn:
        raise TraceError(self.path, self.line, reason)

    def _required(self, name: str) -> Any:
        if name not in self.row:
            self.fail(f"missing field '{name}'")
        return self.row[name]

    def number(self, name: str, minimum: float, maximum: float) -> float:
        value = self._required(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(f"'{name}' must be a number, got {_shown(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            self.fail(f"'{name}' must be a finite number, got {value}")
        if not minimum <= value <= maximum:
            self.fail(f"'{name}' must be from {minimum:g} to {maximum:g}, got {_shown(value)}")
        return float(value)

    def integer(self, name: str, minimum: int, maximum: int) -> int:
        value = self._required(name)
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(f"'{name}' must be an integer, got {_shown(value)}")
        if not minimum <= value <= maximum:
            self.fail(f"'{name}' must be from {minimum} to {maximum}, got {_shown(value)}")
        return int(value)

    def integer_list(
        self, name: str, maximum: int = MAX_TOKEN_ID, max_length: int = MAX_TOKENS
    ) -> list[int]:
        value = self._required(name)
        return self._check_integer_list(name, value, maximum, max_length)

    def optional_integer_list(self, name: str) -> list[int] | None:
        value = self.row.get(name)
        if value is None:
            return None
        return self._check_integer_list(name, value, MAX_TOKEN_ID, MAX_TOKENS)

    def _check_integer_list(
        self, name: str, value: Any, maximum: int, max_length: int
    ) -> list[int]:
        if not isinstance(value, list):
            self.fail(f"'{name}' must be a list of integers, got {type(value).__name__}")
        if len(value) > max_length:  # before its items are checked one by one
            self.fail(f"'{name}' has {len(value)} items, more than {max_length}")
        for position, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, int) or item < 0:
                self.fail(
                    f"'{name}'[{position}] must be a non-negative integer, got {_shown(item)}"
                )
            if item > maximum:
                self.fail(f"'{name}'[{position}] is {_shown(item)}, above the largest {maximum}")
        return value

    def optional_string(self, name: str) -> str | None:
        value = self.row.get(name)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            self.fail(f"'{name}' must be a non-empty string, got {_shown(value)}")
        if len(value) > MAX_LABEL_LENGTH:
            self.fail(f"'{name}' is {len(value)} characters, more than {MAX_LABEL_LENGTH}")
        if not value.isprintable():  # lone surrogates too: they are not printable either
            self.fail(f"'{name}' holds a control or unprintable character: {_shown(value)}")
        return value


def _shown(value: Any) -> str:
    """A value for an error message: short, one line, safe for a terminal."""
    text = (
        ascii(value) if not isinstance(value, int) or value.bit_length() < 64 else "a huge integer"
    )
    return text if len(text) <= 60 else text[:57] + "..."
