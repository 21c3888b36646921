"""`kvscope collect` does not trust its socket: over a thousand malformed, oversized and
forged messages reach a real collector process; it keeps running, stores none of them,
counts every one it read, and then stores a real engine's batches exactly."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import msgspec
import zmq

from collector.store.run_file import RunFile
from engine_hooks.events import (
    WIRE_FORMAT,
    Allocate,
    Arrive,
    Evict,
    Free,
    Hit,
    Pool,
    Store,
    pack_counts,
)
from engine_hooks.transport import MAX_FRAME_BYTES, BatchHeader, EngineSettings
from tests.support.engine import collector_process, replay_to_collector

SETTINGS = EngineSettings(block_size=16, num_blocks=2_000, hash_algo="sha256", vllm_version="0")
HASH = b"\x07" * 32
encode = msgspec.msgpack.Encoder().encode


def header(num_records: int, engine_id: str = "mallory", **changes: object) -> bytes:
    fields = {"dp_rank": 0, "batch_seq": 0, "num_lost_in_engine": 0}
    fields.update(num_dropped_in_transport=0, config=SETTINGS, wire_format=WIRE_FORMAT)
    fields.update(changes)
    return encode(BatchHeader(engine_id, num_records=num_records, **fields))  # type: ignore[arg-type]


def forged_records(rng: random.Random) -> list[object]:
    """Records of the right shape whose values do not fit the run file or are unsafe."""
    return rng.choice(
        [
            [Hit(0, 1, "r", pack_counts([1]), b"\x01\x02")],  # a 2-byte hash
            [Hit(0, 1, "r", pack_counts([1, 2]), HASH + b"\x01")],  # hashes of two widths
            [Pool(-1, 1, None, 1, 1, 1)],  # a negative record number
            [Allocate(0, 1, "r", pack_counts([-5]))],  # a negative block id
            [Allocate(0, 1, "r", pack_counts([2_000]))],  # a block past the engine's pool
            [Allocate(0, 1, "r", b"\x01\x02\x03")],  # block ids not 4 bytes each
            [Arrive(0, 2**63 + 5, "r", 10)],  # a clock past BIGINT
            [Arrive(0, 1, "r\x1b[31m", 10)],  # a terminal escape in a request id
            [Pool(0, 1, None, 1, 1, 1, tenant="a\nb")],  # a newline in a tenant
            [Store(0, 1, "r", pack_counts([1]), HASH, None, 0, 16, extra_keys=[("\x01",)])],
            [Free(0, 1, "r", pack_counts([1, 2]), pack_counts([0]))],  # columns that disagree
            [Free(0, 1, "r", pack_counts([1]), pack_counts([-1]))],  # a negative count
            [Evict(0, 1, None, pack_counts([1]), HASH * 3)],  # three hashes for one block
        ]
    )


def attacks(rng: random.Random) -> list[list[bytes]]:
    """Over a thousand messages (frames after ZMQ's identity), none a batch to store."""
    messages: list[list[bytes]] = []
    for _ in range(300):  # garbage
        messages.append([rng.randbytes(rng.randrange(0, 2_000)) for _ in range(2)])
    for count in (1, 3, 4, 7) * 50:  # the wrong number of frames
        messages.append([encode([1]) for _ in range(count)])
    for _ in range(100):  # well-formed msgpack of the wrong types
        messages.append([encode({"engine_id": 1}), encode([["hit", "x"]])])
        messages.append([header(1), encode([[1, 2, 3]])])
    for _ in range(100):  # a forged engine name
        messages.append(
            [header(1, engine_id="<script>alert(1)</script>"), encode([Pool(0, 1, None, 1, 1, 1)])]
        )
    for _ in range(200):  # forged values
        records = forged_records(rng)
        messages.append([header(len(records)), encode(records)])
    for _ in range(50):  # hooks of another kvscope, whose stream means other things
        messages.append([header(1, wire_format=1), encode([Pool(0, 1, None, 1, 1, 1)])])
    for _ in range(100):  # a header that lies about its batch
        messages.append([header(5), encode([Pool(0, 1, None, 1, 1, 1)])])
    for _ in range(5):  # huge arrays inside the size limit
        huge = Hit(0, 1, "r", pack_counts(list(range(1_000_000))), HASH)
        messages.append([header(1), encode([huge])])
        messages.append([header(1), b"\xdd\x00\xff\xff\xff" + b"\x01" * 1_000_000])
    messages.append([header(1), b"\x91" * 100_000])  # nested a hundred thousand deep
    rng.shuffle(messages)
    return messages


def test_collector_survives_a_thousand_bad_messages_and_stores_a_real_engine(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run.duckdb"
    endpoint = f"ipc://{tmp_path}/collect.ipc"
    messages = attacks(random.Random(18))
    assert len(messages) >= 1_000
    context = zmq.Context()
    with collector_process(run, endpoint) as process:
        attacker = context.socket(zmq.DEALER)
        attacker.connect(endpoint)
        for frames in messages:
            attacker.send_multipart(frames)
        for _ in range(2):  # oversized: ZMQ disconnects the sender before anything is decoded
            oversized = context.socket(zmq.DEALER)
            oversized.connect(endpoint)
            oversized.send_multipart([header(1), b"\x00" * (MAX_FRAME_BYTES + 1)])
            oversized.close(linger=2_000)
        attacker.close(linger=10_000)
        assert process.poll() is None, "the collector kept running"

        hooks, transport = replay_to_collector(endpoint, 60, engine_id="real")
        transport.stop()
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=120)
        assert process.returncode == 0, output
    context.term()
    assert f"{len(messages):,} messages rejected" in output, output
    with RunFile.open(run) as run_file:
        stored = run_file.row(
            "SELECT count(DISTINCT seq), count(DISTINCT engine_id) FROM ("
            " SELECT seq, engine_id FROM events UNION ALL SELECT seq, engine_id FROM pool)"
        )
        engines = run_file.rows("SELECT DISTINCT options->>'engine_id' FROM runs")
    assert stored == (hooks.num_records, 1)
    assert engines == [("real",)]
