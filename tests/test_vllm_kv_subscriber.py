"""vLLM's own KV events, end to end in one process: vLLM's real KVCacheManager (KV events on)
-> vLLM's real ZmqEventPublisher -> kvscope's subscriber -> a real run file."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from collector.live import vllm_kv_subscriber as subscriber_module
from collector.live.vllm_kv_subscriber import (
    NO_REPLAY_ENDPOINT,
    NOT_IN_BUFFER,
    REFUSED,
    REPLAY_TIMED_OUT,
    REPLAY_TOO_LARGE,
    VllmKvEventSubscriber,
)
from collector.replay.block_manager import CacheSettings
from collector.store.run_file import RunFile
from collector.vllm_kv.conflicts import HashConflictDetector
from collector.vllm_kv.ingest import append_vllm_batches
from collector.vllm_kv.wire import Gap, ReceivedBatch
from engine_hooks.events import INT32_MAX
from tests.support.vllm_kv_pipeline import (
    EventSource,
    checked_sockets,
    events_run,
    low64,
    receive,
    serve_until_received,
    subscriber_for,
    wait_until_sent,
    zmq_publisher,
)

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version

SMALL = CacheSettings(block_size=4, num_blocks=5)  # 4 usable blocks: the third request evicts
ROOMY = CacheSettings(block_size=4, num_blocks=256)


@pytest.fixture
def sockets() -> Iterator[Path]:
    with checked_sockets() as directory:
        yield directory


def stored_rows(run_file: RunFile) -> list[tuple[Any, ...]]:
    return run_file.rows(
        """
        SELECT seq, event_index, block_position, ts_ns, kind::VARCHAR, block_hash,
            parent_hash, num_tokens
        FROM vllm_kv_events
        ORDER BY seq, event_index, block_position
        """
    )


def seqs(batches: list[ReceivedBatch]) -> list[int]:
    return [received.seq for received in batches]


def test_every_event_of_a_scripted_workload_is_stored_exactly(
    sockets: Path, tmp_path: Path
) -> None:
    with zmq_publisher(sockets) as publisher, subscriber_for(sockets) as subscriber:
        source = EventSource(publisher, SMALL)
        first = source.serve("r1", list(range(1, 11)), output_ids=[101, 102])
        second = source.serve("r2", list(range(1, 11)), output_ids=[201])
        third = source.serve("r3", list(range(50, 62)))
        assert source.manager.reset_prefix_cache()
        source.step()
        wait_until_sent(publisher)
        received = receive(subscriber, 4)
        assert seqs(received) == [0, 1, 2, 3]
        assert subscriber.take_gaps() == []
        run = events_run(tmp_path / "run.duckdb", SMALL)
        conflicts = append_vllm_batches(run, received, [], HashConflictDetector())
    assert subscriber.closed
    assert conflicts == []
    assert source.hit_tokens == {"r1": 0, "r2": 8, "r3": 0}

    a0, a1, a2 = (low64(block_hash) for block_hash in first.block_hashes)
    c0, c1, c2 = (low64(block_hash) for block_hash in third.block_hashes)
    assert [low64(block_hash) for block_hash in second.block_hashes] == [a0, a1]
    ns = 1_000_000_000
    assert stored_rows(run) == [
        # r1's prefill (step 1, t=1000 s) stores its two full prompt blocks.
        (0, 0, 0, 1000 * ns, "stored", a0, None, 4),
        (0, 0, 1, 1000 * ns, "stored", a1, a0, 4),
        # Its second output token (step 3) fills block 3: tokens 9, 10, 101, 102.
        (1, 0, 0, 1001 * ns, "stored", a2, a1, 4),
        # r2 hits a0 and a1 and fills no block: nothing at all. r3 (step 8) needs three
        # blocks of four: the never-hashed one, then LRU evicts a2 and a1 (a0 was used last).
        (2, 0, 0, 1003_500_000_000, "removed", a2, None, None),
        (2, 1, 0, 1003_500_000_000, "removed", a1, None, None),
        (2, 2, 0, 1003_500_000_000, "stored", c0, None, 4),
        (2, 2, 1, 1003_500_000_000, "stored", c1, c0, 4),
        (2, 2, 2, 1003_500_000_000, "stored", c2, c1, 4),
        # reset_prefix_cache (step 10).
        (3, 0, None, 1004_500_000_000, "cleared", None, None, None),
    ]
    batches = run.rows(
        "SELECT endpoint, dp_rank, epoch, seq, ts_ns, num_events FROM vllm_kv_batches ORDER BY seq"
    )
    endpoint = subscriber.endpoint
    assert batches == [
        (endpoint, 0, 0, 0, 1000 * ns, 1),
        (endpoint, 0, 0, 1, 1001 * ns, 1),
        (endpoint, 0, 0, 2, 1003_500_000_000, 3),
        (endpoint, 0, 0, 3, 1004_500_000_000, 1),
    ]
    medium = run.rows("SELECT DISTINCT medium FROM vllm_kv_events")
    assert sorted(medium, key=str) == [("GPU",), (None,)]  # the clear has no medium
    run.close()


def test_a_prefix_hit_emits_a_block_stored_only_in_full_report_mode(
    sockets: Path, tmp_path: Path
) -> None:
    with zmq_publisher(sockets) as publisher, subscriber_for(sockets) as subscriber:
        source = EventSource(publisher, ROOMY)
        first = source.serve("r1", list(range(1, 11)))
        source.serve("plain-hit", list(range(1, 11)))
        assert source.hit_tokens["plain-hit"] == 8
        assert len(source.published) == 1, "a plain prefix hit emits nothing"
        source.serve("full-hit", list(range(1, 11)), report_mode="full")
        assert source.hit_tokens["full-hit"] == 8
        assert len(source.published) == 2
        wait_until_sent(publisher)
        received = receive(subscriber, 2)
        run = events_run(tmp_path / "run.duckdb", ROOMY)
        detector = HashConflictDetector()
        assert append_vllm_batches(run, received, subscriber.take_gaps(), detector) == []
    a0, a1 = (low64(block_hash) for block_hash in first.block_hashes)
    ns = 1_000_000_000
    # The re-report comes at the lookup (step 4) and says exactly what the store said.
    assert stored_rows(run) == [
        (0, 0, 0, 1000 * ns, "stored", a0, None, 4),
        (0, 0, 1, 1000 * ns, "stored", a1, a0, 4),
        (1, 0, 0, 1002 * ns, "stored", a0, None, 4),
        (1, 0, 1, 1002 * ns, "stored", a1, a0, 4),
    ]
    original, report = source.published
    assert report[0].token_ids == original[0].token_ids == list(range(1, 9))
    assert detector.num_blocks_checked == 4
    run.close()


def test_batches_published_before_the_subscriber_are_healed_by_replay(
    sockets: Path, tmp_path: Path
) -> None:
    with zmq_publisher(sockets) as publisher:
        source = EventSource(publisher, ROOMY)
        for index in range(5):
            source.serve(f"early-{index}", [index * 100 + offset for offset in range(9)])
        wait_until_sent(publisher)  # sent to nobody: PUB/SUB dropped them
        with subscriber_for(sockets) as subscriber:
            received = serve_until_received(source, subscriber)
            assert subscriber.take_gaps() == []
    newest = received[-1].seq
    assert seqs(received) == list(range(newest + 1))
    assert all(batch.replayed for batch in received[:5]), "sent before anyone listened"
    assert not received[-1].replayed
    num_replayed = sum(batch.replayed for batch in received)
    assert subscriber.num_replayed == num_replayed
    # The healed batches are exactly what vLLM emitted, in order.
    assert [batch.batch.events[0].token_ids for batch in received[:5]] == [
        events[0].token_ids for events in source.published[:5]
    ]
    run = events_run(tmp_path / "run.duckdb", ROOMY)
    append_vllm_batches(run, received, [], HashConflictDetector())
    counts = run.row("SELECT count(*), count(*) FILTER (WHERE replayed) FROM vllm_kv_batches")
    assert counts == (newest + 1, num_replayed)
    run.close()


def test_a_restarted_collector_resumes_after_the_last_stored_batch(sockets: Path) -> None:
    with zmq_publisher(sockets) as publisher:
        source = EventSource(publisher, ROOMY)
        with subscriber_for(sockets) as first_collector:
            for index in range(2):
                source.serve(f"before-{index}", [index * 100 + offset for offset in range(9)])
            wait_until_sent(publisher)
            stored = receive(first_collector, 2)
        for index in range(3):  # the collector is down
            source.serve(f"during-{index}", [5_000 + index * 100 + offset for offset in range(9)])
        wait_until_sent(publisher)
        with subscriber_for(sockets, first_seq=stored[-1].seq + 1) as second_collector:
            resumed = second_collector.catch_up()
            assert second_collector.take_gaps() == []
    assert seqs(stored) == [0, 1]
    assert seqs(resumed) == [2, 3, 4]
    assert all(batch.replayed for batch in resumed)


def early_then_live(
    sockets: Path, num_early: int, **publisher_options: Any
) -> tuple[list[ReceivedBatch], list[Gap]]:
    """`num_early` batches published before a subscriber connects, then live ones until it
    receives some: what it received, and the gaps it recorded."""
    with zmq_publisher(sockets, **publisher_options) as publisher:
        source = EventSource(publisher, ROOMY)
        for index in range(num_early):
            source.serve(f"early-{index}", [index * 100 + offset for offset in range(9)])
        wait_until_sent(publisher)
        with subscriber_for(sockets) as subscriber:
            received = serve_until_received(source, subscriber)
            gaps = subscriber.take_gaps()
    return received, gaps


def test_batches_gone_from_the_replay_buffer_are_recorded_as_lost(sockets: Path) -> None:
    received, gaps = early_then_live(sockets, 6, buffer_steps=2)
    live = received[-1].seq
    # vLLM keeps only the last two batches: the one before the live one comes back.
    assert seqs(received) == [live - 1, live]
    assert not received[-1].replayed
    assert [(gap.first_seq, gap.last_seq, gap.reason, gap.dp_rank) for gap in gaps] == [
        (0, live - 2, NOT_IN_BUFFER, 0)
    ]


@pytest.mark.parametrize("replay", ["none", "silent"])
def test_a_gap_without_a_working_replay_socket_is_recorded(sockets: Path, replay: str) -> None:
    replay_endpoint = None if replay == "none" else f"ipc://{sockets}/nobody-answers"
    with zmq_publisher(sockets, replay=False) as publisher:
        source = EventSource(publisher, ROOMY)
        for index in range(3):
            source.serve(f"early-{index}", [index * 100 + offset for offset in range(9)])
        wait_until_sent(publisher)
        with VllmKvEventSubscriber(
            f"ipc://{sockets}/events", replay_endpoint, "kvscope-test", replay_timeout_ms=300
        ) as subscriber:
            received = serve_until_received(source, subscriber)
            gaps = subscriber.take_gaps()
    first_live = received[0].seq
    assert not any(batch.replayed for batch in received)
    reason = NO_REPLAY_ENDPOINT if replay == "none" else REPLAY_TIMED_OUT
    assert [(gap.first_seq, gap.last_seq, gap.reason) for gap in gaps] == [
        (0, first_live - 1, reason)
    ]
    assert gaps[0].num_batches == first_live >= 3


def test_an_engine_restart_starts_a_new_epoch(sockets: Path) -> None:
    """vLLM numbers batches from 0 again after a restart; a live number at or below the last
    live one is the sign. (A restarted engine whose first batch to get through is numbered
    above the old engine's last cannot be told from a gap: the protocol has no engine id.)"""
    with subscriber_for(sockets) as subscriber:
        with zmq_publisher(sockets) as publisher:
            source = EventSource(publisher, ROOMY)
            for index in range(10):
                source.serve(f"first-life-{index}", [index * 100 + offset for offset in range(9)])
            before = serve_until_received(source, subscriber)
            # One poll may return part of what the first life sent: take the rest before the
            # restart (under load the last batches otherwise arrived after it).
            while more := subscriber.poll(300):
                before += more
        with zmq_publisher(sockets) as publisher:
            source = EventSource(publisher, ROOMY)
            after = serve_until_received(source, subscriber)
        assert subscriber.take_gaps() == []
    assert [(batch.epoch, batch.seq) for batch in before] == [
        (0, seq) for seq in range(len(before))
    ]
    assert len(after) < len(before), "the restarted engine got through before batch 10"
    assert [(batch.epoch, batch.seq) for batch in after] == [(1, seq) for seq in range(len(after))]


def test_an_event_type_this_kvscope_does_not_know_is_recorded_as_lost(sockets: Path) -> None:
    from vllm.distributed.kv_events import KVCacheEvent, KVEventBatch  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    class BlockPinned(KVCacheEvent):  # what a future vLLM might add
        block_hashes: list[int]

    with zmq_publisher(sockets) as publisher, subscriber_for(sockets) as subscriber:
        source = EventSource(publisher, ROOMY)
        source.serve("known", list(range(1, 10)))
        publisher.publish(KVEventBatch(ts=2_000.0, events=[BlockPinned(block_hashes=[7])]))
        source.serve("known-again", list(range(20, 29)))
        wait_until_sent(publisher)
        received = receive(subscriber, 2)
        gaps = subscriber.take_gaps()
    assert seqs(received) == [0, 2]
    assert [(gap.first_seq, gap.last_seq) for gap in gaps] == [(1, 1)]
    assert gaps[0].reason.startswith(f"{REFUSED} (invalid)")
    assert "BlockPinned" in gaps[0].reason
    assert subscriber.rejected.by_reason == {"invalid": 1}


@contextmanager
def forged_publisher(sockets: Path) -> Iterator[tuple[str, bytes, Any]]:
    """A plain ZMQ PUB socket to forge vLLM's messages on: its endpoint, the payload of an
    empty batch, and the socket."""
    from vllm.distributed.kv_events import KVEventBatch  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    endpoint = f"ipc://{sockets}/forged.ipc"
    payload = msgspec.msgpack.encode(KVEventBatch(ts=1.0, events=[]))
    context = zmq.Context()
    publisher = context.socket(zmq.PUB)
    publisher.bind(endpoint)
    try:
        yield endpoint, payload, publisher
    finally:
        publisher.close(linger=0)
        context.term()


def test_malformed_messages_are_ignored_and_a_good_one_still_arrives(sockets: Path) -> None:
    """What arrives on the SUB socket is untrusted: a sequence number of the wrong width or
    past what a run file holds, or the wrong frames, is ignored; nothing crashes."""
    with (
        forged_publisher(sockets) as (endpoint, payload, publisher),
        VllmKvEventSubscriber(endpoint, None, "kv") as subscriber,
    ):
        forged = [
            [b"kv", (0).to_bytes(9, "big"), payload],  # nine bytes of sequence number
            [b"kv", (2**64 - 1).to_bytes(8, "big"), payload],  # past BIGINT
            [b"kv", payload],  # two frames
            [b"kv", (0).to_bytes(8, "big"), payload, b"extra"],  # four
        ]
        # ZMQ's slow joiner: a PUB drops what it sends before the SUB is connected, so
        # repeat a good batch until one arrives, then send the forged ones once.
        deadline = time.monotonic() + 30
        while not subscriber.poll(200) and time.monotonic() < deadline:
            publisher.send_multipart([b"kv", (0).to_bytes(8, "big"), payload])
        for frames in forged:
            publisher.send_multipart(frames)
        publisher.send_multipart([b"kv", (1).to_bytes(8, "big"), payload])
        received: list[ReceivedBatch] = []
        while 1 not in seqs(received) and time.monotonic() < deadline:
            received += subscriber.poll(200)
        received += subscriber.poll(200)
        assert seqs(received) == [1]
        assert subscriber.take_gaps() == []


def test_a_replay_past_its_budget_comes_in_rounds_and_loses_nothing(
    sockets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay takes at most REPLAY_BYTES (here: one batch): catching up takes as many
    rounds as vLLM's buffer holds batches, each number once, none lost."""
    monkeypatch.setattr(subscriber_module, "REPLAY_BYTES", 1)
    with zmq_publisher(sockets) as publisher:
        source = EventSource(publisher, ROOMY)
        for index in range(3):
            source.serve(f"early-{index}", [index * 100 + offset for offset in range(9)])
        wait_until_sent(publisher)  # sent to nobody: only the replay buffer has them
        with subscriber_for(sockets) as subscriber:
            rounds = []
            while batches := subscriber.catch_up():
                rounds.append(seqs(batches))
            gaps = subscriber.take_gaps()
    assert rounds == [[seq] for seq in range(len(source.published))]
    assert gaps == []


def test_a_gap_past_the_replay_budget_is_recorded_as_lost(
    sockets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live batch reveals a gap; one replay (here: one batch) heals what it holds, and the
    rest of the gap is recorded with the reason."""
    monkeypatch.setattr(subscriber_module, "REPLAY_BYTES", 1)
    received, gaps = early_then_live(sockets, 3)
    live = received[-1].seq
    assert seqs(received) == [0, live]
    assert [(gap.first_seq, gap.last_seq, gap.reason) for gap in gaps] == [
        (1, live - 1, REPLAY_TOO_LARGE)
    ]


def test_a_poll_decodes_at_most_its_budget_and_the_rest_waits(
    sockets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poll takes at most POLL_BYTES of messages (here: one message); what is left waits in
    ZMQ's queue (or the publisher's) for the next poll, in order, none lost."""
    monkeypatch.setattr(subscriber_module, "POLL_BYTES", 1)
    with zmq_publisher(sockets) as publisher, subscriber_for(sockets) as subscriber:
        source = EventSource(publisher, ROOMY)
        first = serve_until_received(source, subscriber)
        for index in range(3):
            source.serve(f"later-{index}", [index * 100 + offset for offset in range(9)])
        wait_until_sent(publisher)
        polls = [seqs(first)]
        while len(polls) <= len(source.published) - first[-1].seq - 1:
            polls.append(seqs(subscriber.poll(1_000)))
        gaps = subscriber.take_gaps()
    newest = first[-1].seq
    assert polls[1:] == [[seq] for seq in range(newest + 1, len(source.published))]
    assert gaps == []


def test_a_publisher_restarting_past_what_a_run_counts_is_refused(sockets: Path) -> None:
    """Each fall in the numbers is a restart, counted in the run file's INTEGER `epoch`: once
    it holds the largest, a further restart's batches are refused, counted and recorded, and
    the stream goes on in that epoch."""
    with (
        forged_publisher(sockets) as (endpoint, payload, publisher),
        VllmKvEventSubscriber(endpoint, None, "kv", first_seq=5) as subscriber,
    ):
        deadline = time.monotonic() + 30
        while not subscriber.poll(200) and time.monotonic() < deadline:
            publisher.send_multipart([b"kv", (5).to_bytes(8, "big"), payload])
        subscriber.poll(200)  # a repeat that was on its way: a restart, before the test's
        subscriber.epoch = INT32_MAX - 1
        received: list[ReceivedBatch] = []
        for seq in (0, 0, 1):  # a restart (the last the run counts), one more, then on
            publisher.send_multipart([b"kv", seq.to_bytes(8, "big"), payload])
        while len(received) < 2 and time.monotonic() < deadline:
            received += subscriber.poll(200)
        gaps = subscriber.take_gaps()
    assert [(batch.epoch, batch.seq) for batch in received] == [(INT32_MAX, 0), (INT32_MAX, 1)]
    assert subscriber.rejected.by_reason == {"restarts": 1}
    assert [gap.reason.split(":")[0] for gap in gaps] == [f"{REFUSED} (restarts)"]
