"""Well-formed vLLM KV event batches with absurd values: refused whole, counted, logged once,
and never a stop for the collector or the good batches beside them.

The first tests run a real `kvscope collect --vllm-kv-events` process subscribed to vLLM's
real ZmqEventPublisher, which sends each value as vLLM's wire format; the sweep decodes
batches at and past every bound and stores those accepted in a real run file.
"""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from collector.live.vllm_kv_subscriber import REFUSED
from collector.replay.block_manager import CacheSettings
from collector.store.run_file import RunFile
from collector.vllm_kv.conflicts import HashConflictDetector
from collector.vllm_kv.ingest import append_vllm_batches
from collector.vllm_kv.wire import (
    MAX_BLOCKS_PER_BATCH,
    MAX_TS_S,
    ReceivedBatch,
    RefusedBatch,
    decode_batch,
)
from tests.support.engine import replay_to_collector, stop_collector, stored_record_numbers
from tests.support.repo import REPO
from tests.support.vllm_kv_pipeline import (
    events_run,
    socket_directory,
    subscribed_collector,
    wait_until_sent,
)

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version


def stored_event(**fields: Any) -> Any:
    """vLLM's own BlockStored: one 4-token block, with `fields` replaced."""
    from vllm.distributed.kv_events import BlockStored  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    values: dict[str, Any] = {
        "block_hashes": [0xABC],
        "parent_block_hash": None,
        "token_ids": [1, 2, 3, 4],
        "block_size": 4,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    return BlockStored(**{**values, **fields})


def vllm_batch(ts: float = 1_000.0, dp_rank: int | None = None, **fields: Any) -> Any:
    from vllm.distributed.kv_events import KVEventBatch  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    return KVEventBatch(ts=ts, events=[stored_event(**fields)], data_parallel_rank=dp_rank)


# The finding's six values, each alone in a batch between two good ones.
HOSTILE: dict[str, Callable[[], Any]] = {
    "ts-nan": lambda: vllm_batch(ts=math.nan),
    "ts-infinity": lambda: vllm_batch(ts=math.inf),
    "ts-1e15": lambda: vllm_batch(ts=1e15),
    "dp-rank-70000": lambda: vllm_batch(dp_rank=70_000),
    "block-size-2^40": lambda: vllm_batch(block_size=2**40),
    "extra-keys-an-int": lambda: vllm_batch(extra_keys=[5]),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_one_hostile_batch_is_refused_and_the_good_ones_beside_it_are_stored(name: str) -> None:
    with (
        socket_directory() as directory,
        subscribed_collector(directory) as (publisher, process, run),
    ):
        publisher.publish(vllm_batch(ts=1_000.0, block_hashes=[1]))
        publisher.publish(HOSTILE[name]())
        publisher.publish(vllm_batch(ts=1_001.0, block_hashes=[2]))
        wait_until_sent(publisher)
        output = stop_collector(process)
        with RunFile.open(run) as run_file:
            batches = run_file.rows("SELECT seq, ts_ns FROM vllm_kv_batches ORDER BY seq")
            blocks = run_file.rows("SELECT block_hash FROM vllm_kv_events ORDER BY seq")
            gaps = run_file.rows("SELECT first_seq, last_seq, reason FROM vllm_kv_gaps")
    assert batches == [(0, 1_000_000_000_000), (2, 1_001_000_000_000)]
    assert blocks == [(1,), (2,)]
    assert [(first, last) for first, last, _ in gaps] == [(1, 1)]
    assert gaps[0][2].startswith(f"{REFUSED} (invalid): ")
    assert output.count("refused batch 1 from") == 1
    assert "refused vLLM KV event batches: 1 invalid" in output


def test_a_stream_of_refused_batches_is_logged_once_per_reason_and_the_engine_still_served() -> (
    None
):
    """Forty bad batches of two reasons: two log lines, every count, the good batches and an
    engine's records over the collector's own socket all stored."""
    with (
        socket_directory() as directory,
        subscribed_collector(directory) as (publisher, process, run),
    ):
        for index in range(20):
            publisher.publish(vllm_batch(ts=math.inf))
            publisher.publish(vllm_batch(extra_keys=[None, None]))  # two entries, one block
            publisher.publish(vllm_batch(ts=2_000.0 + index, block_hashes=[index]))
        wait_until_sent(publisher)
        hooks, transport = replay_to_collector(f"ipc://{directory}/hooks", 5, engine_id="e")
        transport.stop()
        output = stop_collector(process)
        with RunFile.open(run) as run_file:
            good = run_file.row("SELECT count(*) FROM vllm_kv_batches")
            refused = run_file.rows(
                "SELECT split_part(reason, ':', 1), count(*) FROM vllm_kv_gaps GROUP BY 1 "
                "ORDER BY 1"
            )
        records = stored_record_numbers(run)
    assert good == (20,)
    assert refused == [(f"{REFUSED} (inconsistent)", 20), (f"{REFUSED} (invalid)", 20)]
    assert records == list(range(hooks.num_records))
    assert output.count("kvscope collect: refused batch") == 2
    assert "refused vLLM KV event batches: 20 invalid, 20 inconsistent" in output


def peak_rss_until_exit(process: Any) -> int:
    """The process's peak resident memory (KiB), as the kernel counts it (VmHWM), read until
    it exits. Not the rusage of wait4: that counts the parent's memory it was forked from."""
    peak = 0
    while process.poll() is None:
        try:
            status = Path(f"/proc/{process.pid}/status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            break
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                peak = max(peak, int(line.split()[1]))
        time.sleep(0.05)
    return peak


def test_a_flood_of_the_largest_messages_stays_under_a_gigabyte(tmp_path: Path) -> None:
    """Twelve messages of 15 MiB (15 million token ids each, 8 bytes a token once decoded)
    from a plain PUB socket, as fast as it sends: once, the collector took them all in at
    once (ZMQ queued 100,000 messages, a poll decoded 1,000) and passed 4 GB in seconds.
    Now ZMQ queues 8 here (the rest wait in the sender's queue), a poll decodes 8 MiB of
    them: the collector's peak RSS (VmHWM) stays under 1 GB, and a good batch
    sent after the flood is stored."""
    endpoint = f"ipc://{tmp_path}/events"
    context = zmq.Context()
    publisher = context.socket(zmq.PUB)
    publisher.setsockopt(zmq.SNDHWM, 0)  # the sender keeps whatever the collector leaves
    publisher.bind(endpoint)
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "collector.cli", "collect"),
            *("--db", str(tmp_path / "run.duckdb"), "--endpoint", f"ipc://{tmp_path}/hooks"),
            *("--vllm-kv-events", endpoint, "--idle-exit", "3"),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert "listening" in process.stdout.readline()
        tokens = 15 << 20
        flood = msgspec.msgpack.encode(
            [1.0, [stored(block_hashes=[1], token_ids=[1] * tokens, block_size=1)], 0]
        )
        good = batch_payload(ts=2_000.0, events=[stored(block_hashes=[77])])
        # ZMQ's slow joiner: until the subscription holds, a PUB drops what it sends; the
        # collector says nothing until then, so send one small batch until the run exists.
        seq, deadline = 0, time.monotonic() + 60
        while not (tmp_path / "run.duckdb").exists():
            assert time.monotonic() < deadline, "no batch reached the collector"
            publisher.send_multipart([b"", seq.to_bytes(8, "big"), good])
            seq += 1
            time.sleep(0.2)
        for _ in range(12):
            publisher.send_multipart([b"", seq.to_bytes(8, "big"), flood])
            seq += 1
        publisher.send_multipart([b"", seq.to_bytes(8, "big"), good])
        peak_kib = peak_rss_until_exit(process)  # it exits 3 s after the last batch
        output = process.stdout.read()
    finally:
        if process.returncode is None:
            process.kill()
            process.wait()
        publisher.close(linger=0)
        context.term()
    assert process.returncode == 0, output
    assert peak_kib < 1 << 20, f"peak RSS {peak_kib >> 10} MiB"
    with RunFile.open(tmp_path / "run.duckdb") as run_file:
        last = run_file.row("SELECT max(seq), count(*) FROM vllm_kv_batches")
    assert last is not None and last[0] == seq
    assert last[1] >= 13  # the flood, and the good batches the collector was there for


# -- every bound, at and past it ----------------------------------------------------------


def batch_payload(
    ts: float = 1.0, dp_rank: int | None = 0, events: list[dict[str, Any]] | None = None
) -> bytes:
    """A KVEventBatch in vLLM's wire format (an array; events are maps tagged by `type`)."""
    return msgspec.msgpack.encode([ts, [stored()] if events is None else events, dp_rank])


def stored(**fields: Any) -> dict[str, Any]:
    values: dict[str, Any] = {"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None}
    values.update(token_ids=[1, 2], block_size=2, medium="GPU", group_idx=0)
    return {**values, **fields}


NESTED = b"\x91" * 200_000 + b"\x01"  # an array in an array ... 200,000 deep


def deeply_nested_payload() -> bytes:
    prefix = batch_payload(events=[stored(extra_keys=[[0]])])
    return prefix.replace(msgspec.msgpack.encode([[0]]), b"\x91\x91" + NESTED)


# (name, payload, None when accepted else the reason it is refused)
BOUNDS: list[tuple[str, Callable[[], bytes], str | None]] = [
    ("ts 0", lambda: batch_payload(ts=0.0), None),
    ("ts at the bound", lambda: batch_payload(ts=float(MAX_TS_S)), None),
    ("ts past it", lambda: batch_payload(ts=math.nextafter(MAX_TS_S, math.inf)), "invalid"),
    ("ts negative", lambda: batch_payload(ts=-1e-9), "invalid"),
    ("ts nan", lambda: batch_payload(ts=math.nan), "invalid"),
    ("ts -inf", lambda: batch_payload(ts=-math.inf), "invalid"),
    ("ts 1e308", lambda: batch_payload(ts=1e308), "invalid"),
    ("dp rank none", lambda: batch_payload(dp_rank=None), None),
    ("dp rank at the bound", lambda: batch_payload(dp_rank=2**15 - 1), None),
    ("dp rank past it", lambda: batch_payload(dp_rank=2**15), "invalid"),
    ("dp rank -1", lambda: batch_payload(dp_rank=-1), "invalid"),
    ("dp rank 2^64-1", lambda: batch_payload(dp_rank=2**64 - 1), "invalid"),
    ("block size 0", lambda: batch_payload(events=[stored(block_size=0)]), None),
    ("block size 2^20", lambda: batch_payload(events=[stored(block_size=2**20)]), None),
    ("block size 2^20+1", lambda: batch_payload(events=[stored(block_size=2**20 + 1)]), "invalid"),
    ("block size -1", lambda: batch_payload(events=[stored(block_size=-1)]), "invalid"),
    ("group 63", lambda: batch_payload(events=[stored(group_idx=63)]), None),
    ("group 64", lambda: batch_payload(events=[stored(group_idx=64)]), "invalid"),
    ("group -1", lambda: batch_payload(events=[stored(group_idx=-1)]), "invalid"),
    ("token 2^31-1", lambda: batch_payload(events=[stored(token_ids=[2**31 - 1, 0])]), None),
    ("token 2^31", lambda: batch_payload(events=[stored(token_ids=[2**31, 0])]), "invalid"),
    ("token -1", lambda: batch_payload(events=[stored(token_ids=[-1, 0])]), "invalid"),
    ("hash -2^63", lambda: batch_payload(events=[stored(block_hashes=[-(2**63)])]), None),
    ("hash 2^64-1", lambda: batch_payload(events=[stored(block_hashes=[2**64 - 1])]), None),
    ("hash 1 byte", lambda: batch_payload(events=[stored(block_hashes=[b"\x01"])]), None),
    ("hash 64 bytes", lambda: batch_payload(events=[stored(block_hashes=[b"\x01" * 64])]), None),
    ("hash 0 bytes", lambda: batch_payload(events=[stored(block_hashes=[b""])]), "invalid"),
    ("hash 65 bytes", lambda: batch_payload(events=[stored(block_hashes=[b"1" * 65])]), "invalid"),
    ("hash a string", lambda: batch_payload(events=[stored(block_hashes=["7"])]), "invalid"),
    ("medium 256", lambda: batch_payload(events=[stored(medium="M" * 256)]), None),
    ("medium 257", lambda: batch_payload(events=[stored(medium="M" * 257)]), "invalid"),
    ("medium newline", lambda: batch_payload(events=[stored(medium="GPU\n")]), "invalid"),
    ("lora escape", lambda: batch_payload(events=[stored(lora_name="\x1b[2J")]), "invalid"),
    (
        "extra keys of vLLM's shapes",
        lambda: batch_payload(events=[stored(extra_keys=[["lora", ["mm", 3], b"\x00" * 32]])]),
        None,
    ),
    ("extra keys an int", lambda: batch_payload(events=[stored(extra_keys=[5])]), "invalid"),
    (
        "extra key a map",
        lambda: batch_payload(events=[stored(extra_keys=[[{"a": 1}]])]),
        "invalid",
    ),
    (
        "extra key nested twice",
        lambda: batch_payload(events=[stored(extra_keys=[[["a", ["b"]]]])]),
        "invalid",
    ),
    ("extra key a float", lambda: batch_payload(events=[stored(extra_keys=[[0.5]])]), "invalid"),
    (
        "extra keys for two blocks of one",
        lambda: batch_payload(events=[stored(extra_keys=[None, None])]),
        "inconsistent",
    ),
    (
        "no lookahead for a block",
        lambda: batch_payload(events=[stored(lookahead_token_ids=[])]),
        "inconsistent",
    ),
    ("extra keys 200,000 deep", deeply_nested_payload, "undecodable"),
    (
        "blocks at the bound",
        lambda: batch_payload(
            events=[stored(block_hashes=[1] * MAX_BLOCKS_PER_BATCH, token_ids=[], block_size=0)]
        ),
        None,
    ),
    (
        "blocks past it",
        lambda: batch_payload(
            events=[
                stored(block_hashes=[1] * MAX_BLOCKS_PER_BATCH, token_ids=[], block_size=0),
                {"type": "AllBlocksCleared"},
            ]
        ),
        "too-large",
    ),
    ("an unknown event", lambda: batch_payload(events=[{"type": "BlockPinned"}]), "invalid"),
    ("not a batch", lambda: b"\xc1", "undecodable"),
]


def outcome(payload: bytes) -> str | None:
    try:
        decode_batch(payload)
    except RefusedBatch as refused:
        return refused.reason
    return None


@pytest.mark.parametrize(("name", "payload", "expected"), BOUNDS, ids=[b[0] for b in BOUNDS])
def test_each_bound_is_held_at_and_past_it(
    name: str, payload: Callable[[], bytes], expected: str | None
) -> None:
    assert outcome(payload()) == expected


def test_every_accepted_batch_of_a_hostile_sweep_stores(tmp_path: Path) -> None:
    """10,000 batches, each field at its bounds, or past one a tenth of the time: exactly the
    batches with no value past a bound decode, and all of them store in a real run file
    (their conflicts too: one hash comes with other tokens)."""
    fields: dict[str, tuple[list[Any], list[Any]]] = {  # values within the bounds, past them
        "ts": ([0.0, 1.5, float(MAX_TS_S)], [1e15, math.nan, math.inf, -1.0]),
        "dp_rank": ([None, 0, 2**15 - 1], [70_000, -1, 2**15]),
        "block_size": ([2, 0, 2**20], [2**40, 2**20 + 1, -1]),
        "group_idx": ([None, 0, 63], [64, -1]),
        "medium": ([None, "GPU", "M" * 256], ["x" * 257, "\x07", "GPU\n"]),
        "lora_name": ([None, "adapter"], ["\n", "\x1b[2J"]),
        "extra_keys": ([None, [None], [["salt", ["mm", 1], b"d"]]], [[5], [[1.5]], [None] * 2]),
        "block_hashes": ([[2**64 - 1], [-(2**63)], [b"\xff" * 64]], [[b""], [b"1" * 65]]),
        "token_ids": ([[1, 2], [2**31 - 1, 0]], [[2**31, 0], [-1, 0]]),
    }
    choices = random.Random(36)
    detector = HashConflictDetector(record_token_ids=True)
    accepted: list[ReceivedBatch] = []
    refused = 0
    with events_run(tmp_path / "run.duckdb", CacheSettings(2, 64)) as store:
        for seq in range(10_000):
            past = {name for name in fields if choices.random() < 0.1}
            drawn = {
                name: choices.choice(bad if name in past else good)
                for name, (good, bad) in fields.items()
            }
            ts, dp_rank = drawn.pop("ts"), drawn.pop("dp_rank")
            payload = batch_payload(ts, dp_rank, [stored(**drawn), {"type": "AllBlocksCleared"}])
            try:
                batch = decode_batch(payload)
            except RefusedBatch:
                assert past, drawn
                refused += 1
                continue
            assert not past, (past, drawn)
            accepted.append(ReceivedBatch("ipc://sweep", 0, seq, batch, False))
            if len(accepted) == 1_000:
                append_vllm_batches(store, accepted, [], detector)
                accepted = []
        append_vllm_batches(store, accepted, [], detector)
        rows = store.row("SELECT count(*), count(DISTINCT seq) FROM vllm_kv_batches")
        conflicts = store.row("SELECT count(*) FROM vllm_kv_conflicts")
    assert 5_000 < refused < 7_000  # 1 - 0.9^9 of them: 61 %
    assert rows == (10_000 - refused, 10_000 - refused)
    assert conflicts is not None and conflicts[0] > 0
