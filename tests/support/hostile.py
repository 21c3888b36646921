"""A hostile local user's side of the collector's socket: well-formed batches with absurd
values, sent with plain pyzmq, and a real `kvscope collect` process under a memory cap whose
peak resident memory is read when it exits."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import zmq

from engine_hooks.events import WIRE_FORMAT, Event
from engine_hooks.transport import Ack, BatchHeader, EngineSettings
from tests.support.repo import REPO

encode = msgspec.msgpack.Encoder().encode
PEAK = "peak resident kB:"  # the last line of a capped collector's output


def settings(num_blocks: int = 2_000) -> EngineSettings:
    return EngineSettings(
        block_size=16, num_blocks=num_blocks, hash_algo="sha256", vllm_version="0"
    )


def header(
    engine_id: str,
    records: Sequence[Event],
    *,
    dp_rank: int = 0,
    batch_seq: int = 0,
    num_blocks: int = 2_000,
    **changes: Any,
) -> BatchHeader:
    fields: dict[str, Any] = {
        "num_lost_in_engine": 0,
        "num_dropped_in_transport": 0,
        "config": settings(num_blocks),
        "wire_format": WIRE_FORMAT,
    }
    fields.update(changes)
    return BatchHeader(engine_id, dp_rank, batch_seq, num_records=len(records), **fields)


def frames(batch_header: BatchHeader, records: Sequence[Event]) -> list[bytes]:
    """The two frames of a batch, as the engine's DEALER sends them."""
    return [encode(batch_header), encode(list(records))]


@dataclass
class Exited:
    returncode: int
    output: str
    peak_rss_bytes: int  # the collector's own peak resident memory (-1: it was killed)

    def rejected(self) -> Counter[str]:
        """The messages the collector says it rejected, by reason."""
        match = re.search(r"^kvscope collect: rejected (.*?); the last: ", self.output, re.M)
        counts: Counter[str] = Counter()
        for part in match.group(1).split(", ") if match else ():
            count, reason = part.split(" ", 1)
            counts[reason] = int(count.replace(",", ""))
        return counts


class CappedCollector:
    """`kvscope collect` in a child process whose address space is capped at
    `address_space_bytes` (RLIMIT_AS): an allocation past it fails in the collector, not in
    the host's other processes."""

    def __init__(
        self,
        run: Path,
        endpoint: str,
        address_space_bytes: int,
        *extra_args: str,
        repo: Path = REPO,  # another tree of kvscope's, to measure it (benchmarks)
    ) -> None:
        # The cap is set in the child before it loads kvscope (no preexec_fn: unsafe beside
        # threads); then it is `python -m collector.cli collect ...`, and last it prints its
        # peak resident memory (VmHWM: its own since exec; getrusage's ru_maxrss would keep
        # the parent's, which a fork hands the child before the exec).
        start = "\n".join(
            [
                "import resource, runpy, sys",
                f"resource.setrlimit(resource.RLIMIT_AS, ({address_space_bytes},) * 2)",
                "sys.argv = ['kvscope', *sys.argv[1:]]",
                "try:",
                "    runpy.run_module('collector.cli', run_name='__main__')",
                "finally:",
                "    status = open('/proc/self/status').read()",
                f"    print({PEAK!r}, status.split('VmHWM:')[1].split()[0], flush=True)",
            ]
        )
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                start,
                "collect",
                "--db",
                str(run),
                "--endpoint",
                endpoint,
                "--live-interval",
                "3600",  # no live copies: what is measured is the message path
                *extra_args,
            ],
            cwd=repo,
            env={**os.environ, "PYTHONPATH": str(repo)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert "listening" in line, line + self.process.stdout.read()

    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> Exited:
        """SIGTERM, then its output, exit status and peak memory once it exits."""
        process = self.process
        if self.running():
            process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=600)
        peak = re.search(rf"^{PEAK} (\d+)$", output, re.M)
        return Exited(process.returncode, output, int(peak.group(1)) * 1024 if peak else -1)


class Sender:
    """One DEALER connection (in order, like one engine's), and the acknowledgements it gets."""

    def __init__(self, endpoint: str) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.SNDTIMEO, 120_000)  # zmq.Again: no collector takes any
        self.socket.connect(endpoint)
        self._acks = msgspec.msgpack.Decoder(Ack)
        self.acked: set[int] = set()

    def send(self, message: list[bytes]) -> None:
        self.socket.send_multipart(message)

    def wait_for_ack(self, batch_seq: int, timeout_ms: int = 120_000) -> None:
        """Until the collector acknowledges `batch_seq` (it then has handled every message
        this connection sent before it: one connection delivers in order)."""
        while batch_seq not in self.acked:
            assert self.socket.poll(timeout_ms), f"no acknowledgement of batch {batch_seq}"
            self.acked.update(self._acks.decode(self.socket.recv()).batch_seqs)

    def close(self) -> None:
        self.socket.close(linger=10_000)
        self.context.term()
