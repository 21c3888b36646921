"""The trace parser under fuzzing: 12,000 traces, both formats, plain and gzip, each with one
damaged line among good ones. Every outcome is accepted requests or a `FILE:LINE: reason`
naming the damaged line (or, for a damaged gzip stream, some line); never another
exception. Through the command line, every failure exits 2 and leaves no file behind."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from collector.cli import main
from collector.replay.traces import TraceError, read_trace

CASES_PER_FORMAT = 3_000  # x 2 formats x (plain, gzip) = 12,000 traces per run

ODD_VALUES: list[object] = [
    -1,
    0,
    1,
    2**31,
    2**63,
    10**400,
    -(10**400),
    1e308,
    1.5,
    -0.0,
    True,
    None,
    "",
    "x",
    "\x1b[31mred",
    "line\nbreak",
    "a" * 300,
    [],
    [1, "2"],
    [[[[1]]]],
    {},
    {"a": 1},
    4_194_304,
]
RAW_VALUES = [
    "NaN",
    "Infinity",
    "-Infinity",
    "1" + "0" * 5000,
    "[" * 5000 + "]" * 5000,
    '"\\ud800"',
    '"\\udfff tail"',
    "1e999",
    "9223372036854775808",
]


def good_line(rng: random.Random, index: int, mooncake: bool) -> str:
    if mooncake:
        blocks = rng.randrange(1, 4)
        row: dict[str, object] = {
            "timestamp": index * 10,
            "input_length": blocks * 512 - rng.randrange(0, 500),
            "output_length": rng.randrange(0, 8),
            "hash_ids": [rng.randrange(0, 1000) for _ in range(blocks)],
        }
    else:
        row = {
            "timestamp": index * 10,
            "token_ids": [rng.randrange(0, 32000) for _ in range(rng.randrange(1, 40))],
            "output_length": rng.randrange(0, 8),
            "request_id": f"good-{index}",
            "tenant": rng.choice(["acme", "globex"]),
        }
    return json.dumps(row)


def damage(rng: random.Random, line: str) -> bytes:
    """One of several kinds of damage to one JSON line, as the bytes written."""
    kind = rng.randrange(7)
    data = line.encode()
    if kind == 0:  # flip bytes
        flipped = bytearray(data)
        for _ in range(rng.randrange(1, 4)):
            position = rng.randrange(len(flipped))
            flipped[position] ^= 1 << rng.randrange(8)
        return bytes(flipped).replace(b"\n", b" ")
    if kind == 1:  # cut short
        return data[: rng.randrange(len(data))]
    if kind == 2:  # raw bytes that are not UTF-8
        position = rng.randrange(len(data))
        return data[:position] + bytes([rng.choice([0x80, 0xC3, 0xFF, 0xFE])]) + data[position:]
    row = json.loads(line)
    field = rng.choice([*row, "request_id", "tenant", "lora", "cache_salt", "output_token_ids"])
    if kind == 3:  # an odd value
        row[field] = rng.choice(ODD_VALUES)
        return json.dumps(row).encode()
    if kind == 4:  # a value JSON allows (or Python's json reads) that a trace must not hold
        row[field] = "__RAW__"
        return json.dumps(row).replace('"__RAW__"', rng.choice(RAW_VALUES)).encode()
    if kind == 5:  # a field missing
        row.pop(field, None)
        return json.dumps(row).encode()
    return json.dumps(rng.choice(ODD_VALUES)).encode()  # not an object at all


def fuzz_trace(rng: random.Random, mooncake: bool) -> tuple[bytes, int]:
    """A trace of good lines with one damaged line; returns its bytes and the line a
    refusal must name (0, "holds no requests", when damage left the only line blank)."""
    lines = [good_line(rng, index, mooncake).encode() for index in range(rng.randrange(1, 6))]
    damaged_at = rng.randrange(len(lines))
    lines[damaged_at] = damage(rng, lines[damaged_at].decode())
    blank_trace = len(lines) == 1 and not lines[0].strip()
    return b"\n".join(lines) + b"\n", 0 if blank_trace else damaged_at + 1


def where(path: Path, line: int) -> str:
    """How a refusal starts: the file and line, or the file alone for the whole file."""
    return f"{path}:{line}: " if line else f"{path}: "


@pytest.mark.parametrize("mooncake", [True, False], ids=["mooncake", "kvscope"])
@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
def test_every_fuzzed_trace_is_read_or_names_its_bad_line(
    tmp_path: Path, mooncake: bool, compressed: bool
) -> None:
    rng = random.Random(f"{mooncake}-{compressed}")
    path = tmp_path / ("trace.jsonl.gz" if compressed else "trace.jsonl")
    outcomes = {"read": 0, "refused": 0}
    for _ in range(CASES_PER_FORMAT):
        data, damaged_at = fuzz_trace(rng, mooncake)
        path.write_bytes(gzip.compress(data) if compressed else data)
        try:
            requests = read_trace(path)
        except TraceError as error:
            assert str(error).startswith(where(path, damaged_at)), (data, str(error))
            assert "\n" not in str(error) and "\x1b" not in str(error)
            outcomes["refused"] += 1
            continue
        assert all(request.num_prompt_tokens > 0 for request in requests)
        outcomes["read"] += 1
    assert outcomes["refused"] > CASES_PER_FORMAT // 2, outcomes


def test_a_damaged_gzip_stream_is_a_trace_error(tmp_path: Path) -> None:
    rng = random.Random(7)
    path = tmp_path / "trace.jsonl.gz"
    for _ in range(300):
        data = bytearray(gzip.compress(fuzz_trace(rng, mooncake=False)[0]))
        data[rng.randrange(10, len(data))] ^= 0xFF
        path.write_bytes(bytes(data))
        try:
            read_trace(path)
        except TraceError as error:
            assert str(error).startswith(f"{path}:")


def test_every_failure_through_the_command_line_exits_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(11)
    trace = tmp_path / "trace.jsonl"
    out = tmp_path / "run.duckdb"
    failures = 0
    while failures < 150:
        data, damaged_at = fuzz_trace(rng, mooncake=rng.random() < 0.5)
        trace.write_bytes(data)
        code = main(["replay", str(trace), "--out", str(out), "--block-size", "16", "--quiet"])
        error = capsys.readouterr().err
        if code == 0:
            out.unlink()
            continue
        failures += 1
        assert code == 2, error
        assert error.startswith(f"kvscope: error: {where(trace, damaged_at)}"), error
        assert sorted(tmp_path.iterdir()) == [trace], "no run file, no temporary file"


def test_a_whole_file_refusal_names_no_line(tmp_path: Path) -> None:
    missing = tmp_path / "trace.jsonl.g"
    with pytest.raises(TraceError) as refusal:
        read_trace(missing)
    assert str(refusal.value) == f"{missing}: cannot open: No such file or directory"
