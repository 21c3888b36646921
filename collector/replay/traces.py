"""Request traces kvscope replays: Mooncake JSONL and kvscope's own request-trace JSONL.

Mooncake (`hash_ids`): one id per 512-token block, prefix-chained. Each id expands into a
deterministic run of 512 token ids (`id * 512 + offset`): equal ids give equal tokens, so
vLLM's own hashing sees equal blocks as equal, and different ids never share a token.

kvscope (`token_ids`): see README.md, "Request-trace format".
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

MOONCAKE_BLOCK_TOKENS = 512
MAX_TOKEN_ID = 2**31 - 1
MAX_HASH_ID = MAX_TOKEN_ID // MOONCAKE_BLOCK_TOKENS  # its 512 token ids stay valid ids
MAX_TOKENS = 2**24  # prompt or output tokens of one request: far past any model's context
MAX_TIMESTAMP_MS = 10**12  # 31 years after the trace starts; the replay clock is int64 ns
MAX_LABEL_LENGTH = 256
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


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace, validated; prompt tokens are expanded on demand."""

    line: int
    request_id: str
    timestamp_ms: float
    num_prompt_tokens: int
    output_length: int
    tenant: str | None = None
    lora: str | None = None
    cache_salt: str | None = None
    token_ids: tuple[int, ...] | None = None
    hash_ids: tuple[int, ...] | None = None
    output_token_ids: tuple[int, ...] | None = None

    def prompt_token_ids(self) -> list[int]:
        """The prompt as token ids (Mooncake ids expanded, cut at the input length)."""
        if self.token_ids is not None:
            return list(self.token_ids)
        assert self.hash_ids is not None
        tokens: list[int] = []
        for block_id in self.hash_ids:
            start = block_id * MOONCAKE_BLOCK_TOKENS
            tokens.extend(range(start, start + MOONCAKE_BLOCK_TOKENS))
        del tokens[self.num_prompt_tokens :]
        return tokens


def read_trace(path: Path, trace_format: str = "auto") -> list[TraceRequest]:
    """Read and validate a whole trace; raise `TraceError` at the first bad line."""
    if trace_format not in FORMATS:
        raise ValueError(f"unknown trace format {trace_format!r}; use one of {FORMATS}")
    requests: list[TraceRequest] = []
    seen_ids: set[str] = set()
    with _open_text(path) as handle:
        for line_number, text in _numbered_lines(path, handle):
            request = _parse_line(path, line_number, text, trace_format, len(requests))
            if request.request_id in seen_ids:
                raise TraceError(path, line_number, f"duplicate request_id {request.request_id!r}")
            seen_ids.add(request.request_id)
            requests.append(request)
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
    line_number = 0
    try:
        for line_number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise TraceError(path, line_number, f"not UTF-8 text: {error.reason}") from None
            if text.strip():
                yield line_number, text
    except (OSError, EOFError, zlib.error) as error:
        raise TraceError(path, line_number + 1, f"cannot read: {error}") from error


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
    hash_ids = fields.integer_list("hash_ids", maximum=MAX_HASH_ID)
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
    if len(token_ids) > MAX_TOKENS:
        fields.fail(f"'token_ids' has {len(token_ids)} tokens, more than {MAX_TOKENS}")
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

    def integer_list(self, name: str, maximum: int = MAX_TOKEN_ID) -> list[int]:
        value = self._required(name)
        return self._check_integer_list(name, value, maximum)

    def optional_integer_list(self, name: str) -> list[int] | None:
        value = self.row.get(name)
        return None if value is None else self._check_integer_list(name, value, MAX_TOKEN_ID)

    def _check_integer_list(self, name: str, value: Any, maximum: int) -> list[int]:
        if not isinstance(value, list):
            self.fail(f"'{name}' must be a list of integers, got {type(value).__name__}")
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
