"""Traces are read in bounded memory whatever their lines hold: trace bombs (a gzip of a few
MB holding one line of a gigabyte, a line of hundreds of millions of tokens, a line of millions
of object members) are refused at their line, under an address-space cap of 1 GiB, holding
no more than one line of MAX_LINE_BYTES; and `--limit N` reads no line after the Nth request,
the replay reading its trace once."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from collector.cli import main
from collector.replay.traces import MAX_LINE_BYTES, MAX_LINE_MEMBERS, MAX_LINE_VALUES, read_trace
from tests.support.python_script import run_python
from tests.support.repo import SAMPLE_TRACE

ADDRESS_SPACE_CAP = 2**30
PREFIX = b'{"timestamp": 0, "output_length": 0, "token_ids": ['

# Reads the trace under an address-space cap: a line held whole would not fit in it.
READER = f"""
import resource, sys
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, ({ADDRESS_SPACE_CAP}, {ADDRESS_SPACE_CAP}))
from collector.replay.traces import TraceError, read_trace
try:
    read_trace(Path(sys.argv[1]))
    print("read")
except TraceError as error:
    print(error)
# This process's own peak (VmHWM): ru_maxrss would also count the parent it was forked from
# (a pytest session of a few GiB by the end of the suite).
peak_kib = next(
    line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")
)
print(int(peak_kib) * 1024)
"""


def gzip_line(path: Path, pieces: list[tuple[bytes, int]]) -> Path:
    """A gzip of one line: each (bytes, times) written in turn, then a newline."""
    with gzip.open(path, "wb", compresslevel=1) as out:
        for piece, times in pieces:
            chunk = piece * max(1, 2**24 // len(piece))
            left = len(piece) * times
            while left > 0:
                out.write(chunk[:left])
                left -= len(chunk)
        out.write(b"\n")
    return path


def many_members(count: int) -> bytes:
    return PREFIX + b"1]" + b"".join(b',"k%d": 0' % index for index in range(count)) + b"}"


BOMBS = {
    # 3.1 MB of gzip, 1 GiB of one character: refused after MAX_LINE_BYTES of it.
    "gigabyte-line": ([(b"a", 2**30)], f"line longer than {MAX_LINE_BYTES:,} bytes"),
    # Valid JSON: 300 million tokens in 600 MB.
    "600-MB-of-tokens": (
        [(PREFIX, 1), (b"1,", 300_000_000), (b"1]}", 1)],
        f"line longer than {MAX_LINE_BYTES:,} bytes",
    ),
    # Valid JSON within the byte bound: 100 million tokens in 200 MB.
    "100-million-tokens": (
        [(PREFIX, 1), (b"1,", 100_000_000), (b"1]}", 1)],
        f"more than {MAX_LINE_VALUES:,} values",
    ),
    # Valid JSON: 2 million members of one object, each a key of its own.
    "2-million-members": (
        [(many_members(2_000_000), 1)],
        f"more than {MAX_LINE_MEMBERS:,} object members",
    ),
}


@pytest.mark.parametrize("name", BOMBS)
def test_a_trace_bomb_is_refused_at_its_line_in_bounded_memory(tmp_path: Path, name: str) -> None:
    pieces, reason = BOMBS[name]
    trace = gzip_line(tmp_path / f"{name}.jsonl.gz", pieces)
    assert trace.stat().st_size < 8 * 2**20
    message, peak_rss = read_capped(trace)
    assert message == f"{trace}:1: {reason}" or message.startswith(f"{trace}:1: {reason},")
    assert peak_rss < MAX_LINE_BYTES + 2**27, f"{peak_rss / 2**20:.0f} MiB"


def test_a_plain_file_of_one_endless_line_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    trace = tmp_path / "zeros.jsonl"
    with trace.open("wb") as handle:
        handle.truncate(2**30)  # sparse: a gigabyte of zero bytes and no newline, no disk
    message, peak_rss = read_capped(trace)
    assert message.startswith(f"{trace}:1: line longer than {MAX_LINE_BYTES:,} bytes")
    assert peak_rss < MAX_LINE_BYTES + 2**27, f"{peak_rss / 2**20:.0f} MiB"


def read_capped(trace: Path) -> tuple[str, int]:
    """read_trace in a process capped at ADDRESS_SPACE_CAP: its one line of output (the
    refusal) and its peak resident memory in bytes."""
    result = run_python(READER, str(trace), check=False)
    assert result.returncode == 0 and not result.stderr, result.stderr
    message, peak_rss = result.stdout.splitlines()
    return message, int(peak_rss)


def test_the_replay_command_refuses_a_bomb_with_its_line_and_writes_nothing(
    tmp_path: Path,
) -> None:
    trace = gzip_line(tmp_path / "bomb.jsonl.gz", [(PREFIX, 1), (b"1,", 300_000_000)])
    out = tmp_path / "run.duckdb"
    kvscope = Path(sys.executable).parent / "kvscope"
    result = subprocess.run(
        [str(kvscope), "replay", str(trace), "--out", str(out), "--quiet"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.startswith(f"kvscope: error: {trace}:1: line longer than ")
    assert "Traceback" not in result.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bomb.jsonl.gz"]


def sample_lines(count: int) -> list[str]:
    with gzip.open(SAMPLE_TRACE, "rt") as handle:
        return [next(handle) for _ in range(count)]


def bytes_read_by_this_thread() -> int:
    """What this thread has read through system calls, by the kernel's count."""
    for line in Path("/proc/thread-self/io").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == "rchar":
            return int(value)
    raise AssertionError("no rchar in /proc/thread-self/io")


def test_a_limit_reads_no_line_after_its_last_request(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    # Two requests, then 32 MiB the limit must never reach (it would not parse).
    trace.write_text("".join(sample_lines(2)) + ("not json\n" * 2**22))
    before = bytes_read_by_this_thread()
    requests = read_trace(trace, limit=2)
    read = bytes_read_by_this_thread() - before
    assert [request.line for request in requests] == [1, 2]
    assert read < 2**20, f"{read:,} bytes read for two lines"


def test_replay_with_a_limit_reads_its_trace_once_and_no_further(tmp_path: Path) -> None:
    """The trace is a named pipe: it can be read once, and what a second reader would get
    is not a trace. Its third line is not JSON: a limit of 2 never reads it."""
    trace = tmp_path / "trace.jsonl"
    os.mkfifo(trace)
    feeder = threading.Thread(
        target=_feed, args=(trace, "".join(sample_lines(2)) + "not json\n"), daemon=True
    )
    feeder.start()
    out = tmp_path / "run.duckdb"
    try:
        code = main(["replay", str(trace), "--out", str(out), "--limit", "2", "--quiet"])
    finally:
        reader = os.open(trace, os.O_RDONLY | os.O_NONBLOCK)  # lets the feeder finish
        feeder.join()
        os.close(reader)
    assert code == 0
    assert out.is_file()


def _feed(fifo: Path, text: str) -> None:
    """The trace to the first reader; to any second reader, a line that is not JSON."""
    for content in (text, "second pass\n"):
        try:
            with fifo.open("w") as pipe:
                pipe.write(content)
        except BrokenPipeError:
            pass  # the reader had what it needed and closed the pipe
