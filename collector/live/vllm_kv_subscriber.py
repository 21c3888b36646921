"""A subscriber to vLLM's own KV events that notices lost batches and asks vLLM to resend them.

vLLM's `ZmqEventPublisher` numbers its batches 0, 1, 2, ... on a PUB socket and keeps the last
`buffer_steps` (10,000 by default) for a ROUTER "replay" socket: a client sends the first
sequence number it wants (8 bytes, big-endian) and gets every buffered batch from there on as
`[topic, seq, payload]`, then an end marker with seq -1. PUB/SUB loses messages silently (a
subscriber that joins late or falls behind its high-water mark), so the sequence numbers are
the only witness: a jump is a gap, healed from the replay buffer when it still holds the
batches, and recorded as a `Gap` when it does not.

Memory is bounded whatever a publisher sends: a message is at most MAX_MESSAGE_BYTES, ZMQ
queues at most RECEIVE_HIGH_WATER_MARK of them here (beyond, it leaves them in the
publisher's queue: vLLM keeps 100,000), a poll decodes at most POLL_BYTES of them or
MAX_BLOCKS_PER_BATCH block rows (at least one batch), and a replay takes at most
REPLAY_BYTES (the rest is asked for again, or recorded as lost).

A batch that is not one this collector stores (`wire.decode_batch`: undecodable, a value past
the collector's bounds, fields that disagree, too many blocks) is refused whole: recorded as a
gap saying why, counted by reason (`rejected`), logged the first time each reason occurs, and
the batches beside it are handed out as usual.
"""

from __future__ import annotations

import logging
import time
from types import TracebackType

import zmq

from collector.live.batch_check import Rejections
from collector.safe_text import shown
from collector.vllm_kv.wire import (
    MAX_BLOCKS_PER_BATCH,
    MAX_MESSAGE_BYTES,
    Gap,
    ReceivedBatch,
    RefusedBatch,
    decode_batch,
    num_rows,
)
from engine_hooks.endpoint import check_endpoint
from engine_hooks.events import INT32_MAX, INT64_MAX

END_SEQ = (-1).to_bytes(8, "big", signed=True)
# Messages ZMQ queues on this side: 128 MiB at most. A PUB socket does not drop what a slow
# SUB leaves queued; it holds it in its own queue (vLLM's: 100,000 batches) until read.
RECEIVE_HIGH_WATER_MARK = 8
# Of messages one poll decodes: one of the largest alone, or many small ones.
POLL_BYTES = MAX_MESSAGE_BYTES // 2
REPLAY_BYTES = 64 << 20  # of one replay: 10,000 steps of 6 KiB
SEQ_BYTES = 8

NO_REPLAY_ENDPOINT = "no replay endpoint was given"
NOT_IN_BUFFER = "no longer in vLLM's replay buffer"
REPLAY_TIMED_OUT = "vLLM's replay socket did not answer in time"
REPLAY_TOO_LARGE = f"more than kvscope takes from one replay ({REPLAY_BYTES >> 20} MiB)"
REFUSED = "refused"

logger = logging.getLogger("kvscope.collect")


class VllmKvEventSubscriber:
    """Receives `KVEventBatch`es in sequence order from one vLLM publisher (one DP rank).

    `first_seq` is the batch expected first: 0 for a new run (earlier batches the replay
    buffer no longer holds are a gap), or one past the last stored batch to resume. The
    endpoints are checked as the collector's own (`check_endpoint`): an abstract socket, which
    anyone could bind first and feed, only when allowed; no port 0.
    """

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        *,
        first_seq: int = 0,
        replay_timeout_ms: int = 2_000,
        allow_abstract: bool | None = None,
    ) -> None:
        for checked in (endpoint, replay_endpoint):
            if checked is not None:
                check_endpoint(checked, allow_abstract)
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.replay_timeout_ms = replay_timeout_ms
        self.epoch = 0
        self.num_received = 0
        self.num_replayed = 0
        self.num_duplicates = 0
        self.rejected = Rejections()  # batches refused, by reason
        self._topic = topic.encode()
        self._next_seq = first_seq
        self._last_live_seq: int | None = None
        self._gaps: list[Gap] = []
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socket = self._context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.RCVHWM, RECEIVE_HIGH_WATER_MARK)
        self._socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self._socket.setsockopt(zmq.SUBSCRIBE, self._topic)
        self._socket.connect(endpoint)

    def resume_at(self, seq: int) -> None:
        """Expect batch `seq` next: a run that already stored the ones before it."""
        self._next_seq = seq

    @property
    def next_seq(self) -> int:
        """The sequence number of the next batch this subscriber will hand out."""
        return self._next_seq

    def poll(self, timeout_ms: int, max_batches: int = 1_000) -> list[ReceivedBatch]:
        """Batches that arrived within `timeout_ms`, in sequence order, gaps healed when
        vLLM's replay buffer allows: at most `max_batches` live ones per call, POLL_BYTES of
        them, or MAX_BLOCKS_PER_BATCH block rows (what is left waits for the next call)."""
        received: list[ReceivedBatch] = []
        if not self._socket.poll(timeout_ms):
            return received
        taken_bytes = rows = 0
        for _ in range(max_batches):
            if taken_bytes >= POLL_BYTES or rows >= MAX_BLOCKS_PER_BATCH:
                break
            try:
                frames = self._socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            taken_bytes += sum(map(len, frames))
            batches = self._on_live_message(frames)
            rows += sum(num_rows(received.batch) for received in batches)
            received.extend(batches)
        return received

    def catch_up(self) -> list[ReceivedBatch]:
        """Ask the replay socket for every batch from `next_seq` on, without waiting for a
        live one to reveal a gap: call it on start (a late join) and before stopping.
        Returns nothing when the socket does not answer in time (nothing is known lost)."""
        if self.replay_endpoint is None:
            return []
        replies, ending = self._request_replay(self._next_seq)
        if ending == REPLAY_TIMED_OUT:
            return []
        # All that vLLM holds, or REPLAY_BYTES of it: the rest, still held, comes next time.
        newest = max((seq for seq, _ in replies), default=self._next_seq - 1)
        batches = self._take_replies(replies, self._next_seq, newest, None)
        self._next_seq = max(self._next_seq, newest + 1)
        return batches

    def take_gaps(self) -> list[Gap]:
        """The gaps recorded since the last call (batches that could not be recovered)."""
        gaps, self._gaps = self._gaps, []
        return gaps

    @property
    def closed(self) -> bool:
        return bool(self._socket.closed)

    def close(self) -> None:
        self._socket.close(linger=0)

    def __enter__(self) -> VllmKvEventSubscriber:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- live messages --------------------------------------------------------------

    def _on_live_message(self, frames: list[bytes]) -> list[ReceivedBatch]:
        if len(frames) != 3 or frames[0] != self._topic:
            return []  # another topic sharing our prefix, or not vLLM's message shape
        _, seq_bytes, payload = frames
        seq = _sequence_number(seq_bytes)
        if seq is None:
            return []
        if self._last_live_seq is not None and seq <= self._last_live_seq:
            # One PUB socket's numbers only rise: the engine restarted and counts from 0.
            if self.epoch == INT32_MAX:  # the run file's INTEGER: a publisher forever restarting
                self._refuse(seq, RefusedBatch("restarts", f"{INT32_MAX:,} restarts already"))
                return []
            self.epoch += 1
            self._next_seq = 0
        self._last_live_seq = seq
        if seq < self._next_seq:
            self.num_duplicates += 1  # already handed out from the replay buffer
            return []
        batch = self._decode(seq, payload, replayed=False)
        dp_rank = batch.batch.data_parallel_rank if batch else None
        recovered = self._recover(self._next_seq, seq - 1, dp_rank) if seq > self._next_seq else []
        self._next_seq = seq + 1
        return [*recovered, batch] if batch else recovered

    def _decode(self, seq: int, payload: bytes, replayed: bool) -> ReceivedBatch | None:
        try:
            batch = decode_batch(payload)
        except RefusedBatch as refused:
            self._refuse(seq, refused)
            return None
        self.num_received += 1
        self.num_replayed += replayed
        return ReceivedBatch(self.endpoint, self.epoch, seq, batch, replayed)

    # -- replay ---------------------------------------------------------------------

    def _recover(self, first_seq: int, last_seq: int, dp_rank: int | None) -> list[ReceivedBatch]:
        """Batches first_seq..last_seq from the replay socket; what it lacks becomes a gap."""
        if self.replay_endpoint is None:
            self._record_gap(first_seq, last_seq, dp_rank, NO_REPLAY_ENDPOINT)
            return []
        replies, ending = self._request_replay(first_seq)
        if ending == REPLAY_TIMED_OUT:
            self._record_gap(first_seq, last_seq, dp_rank, REPLAY_TIMED_OUT)
            return []
        if ending == REPLAY_TOO_LARGE:
            newest = max((seq for seq, _ in replies), default=first_seq - 1)
            batches = self._take_replies(replies, first_seq, min(newest, last_seq), dp_rank)
            if newest < last_seq:
                self._record_gap(max(newest + 1, first_seq), last_seq, dp_rank, REPLAY_TOO_LARGE)
            return batches
        return self._take_replies(replies, first_seq, last_seq, dp_rank)

    def _take_replies(
        self,
        replies: list[tuple[int, bytes]],
        first_seq: int,
        last_seq: int,
        dp_rank: int | None,
    ) -> list[ReceivedBatch]:
        """Decode the replies in first_seq..last_seq; record the numbers that are missing."""
        batches: list[ReceivedBatch] = []
        expected = first_seq
        for seq, payload in sorted(replies):
            if seq < expected or seq > last_seq:
                continue
            if seq > expected:
                self._record_gap(expected, seq - 1, dp_rank, NOT_IN_BUFFER)
            batch = self._decode(seq, payload, replayed=True)
            if batch:
                batches.append(batch)
                dp_rank = batch.batch.data_parallel_rank
            expected = seq + 1
        if expected <= last_seq:
            self._record_gap(expected, last_seq, dp_rank, NOT_IN_BUFFER)
        return batches

    def _request_replay(self, first_seq: int) -> tuple[list[tuple[int, bytes]], str | None]:
        """Every buffered (seq, payload) from first_seq on, up to REPLAY_BYTES of them, and
        why they may not be all: None when the end marker came, REPLAY_TIMED_OUT,
        REPLAY_TOO_LARGE.

        A fresh DEALER per request, so a late answer to a request that timed out can never
        be read as the answer to the next one.
        """
        assert self.replay_endpoint is not None
        replies: list[tuple[int, bytes]] = []
        taken_bytes = 0
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.RCVHWM, RECEIVE_HIGH_WATER_MARK)
        dealer.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        try:
            dealer.connect(self.replay_endpoint)
            dealer.send_multipart([b"", first_seq.to_bytes(8, "big")])
            deadline = time.monotonic() + self.replay_timeout_ms / 1000
            while True:
                remaining_ms = round((deadline - time.monotonic()) * 1000)
                if remaining_ms <= 0 or not dealer.poll(remaining_ms):
                    return replies, REPLAY_TIMED_OUT
                frames = dealer.recv_multipart()
                if len(frames) != 4:
                    continue
                _, topic, seq_bytes, payload = frames
                if seq_bytes == END_SEQ:
                    return replies, None
                seq = _sequence_number(seq_bytes)
                if topic == self._topic and seq is not None:
                    if replies and taken_bytes + len(payload) > REPLAY_BYTES:
                        return replies, REPLAY_TOO_LARGE  # one batch always comes
                    taken_bytes += len(payload)
                    replies.append((seq, payload))
        finally:
            dealer.close(linger=0)

    def _refuse(self, seq: int, refused: RefusedBatch) -> None:
        """Record batch `seq` as lost for `refused`'s reason; count it, and log its reason the
        first time (a stream of bad batches writes one line, not one a batch)."""
        detail = shown(str(refused).removeprefix(f"{refused.reason}: "))
        first = refused.reason not in self.rejected.by_reason
        self.rejected.count(refused)
        self._record_gap(seq, seq, None, f"{REFUSED} ({refused.reason}): {detail}")
        if first:
            logger.warning(
                "kvscope collect: refused batch %d from %s (%s): %s; later batches refused "
                "for this reason are counted, not logged",
                seq,
                shown(self.endpoint),
                refused.reason,
                detail,
            )

    def _record_gap(self, first_seq: int, last_seq: int, dp_rank: int | None, reason: str) -> None:
        self._gaps.append(
            Gap(self.endpoint, self.epoch, dp_rank, first_seq, last_seq, reason, time.time_ns())
        )


def _sequence_number(seq_bytes: bytes) -> int | None:
    """A batch's number from its frame, or None when it is not vLLM's 8 bytes or is past
    what vLLM's publisher reaches (and a run file's BIGINT holds)."""
    if len(seq_bytes) != SEQ_BYTES:
        return None
    seq = int.from_bytes(seq_bytes, "big")
    return seq if seq <= INT64_MAX else None
