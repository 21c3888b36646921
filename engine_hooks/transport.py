"""Ships the hooks' records to `kvscope collect` from a background thread; never blocks vLLM.

Wire protocol (ZMQ DEALER -> the collector's ROUTER): each message is two frames, a msgpack
header (`BatchHeader`) and a msgpack list of records (`engine_hooks.events`). The collector
answers `Ack(batch_seqs)` with the numbers of the batches it has just committed to DuckDB.

A batch counts as delivered when it is acknowledged. Until then it is the backlog: ZMQ
queues what a collector has not taken yet (none connected yet, or one briefly busy with a
live refresh or a checkpoint) and hands it over when it can, so an engine's first burst
waits for a collector that starts a little later and a slow moment costs nothing. The
backlog is bounded twice: at most `max_in_flight` batches and `max_backlog_bytes` of encoded
records (one batch alone always goes). A batch is dropped, and its records counted in
`num_dropped`, only when it would pass either bound, when a later batch is acknowledged
before it (it went to a collector that stopped before storing it: one connection delivers
in order), or when it is still unacknowledged at `stop` (after up to the flush timeout
while a collector is connected). The last message `stop` sends is a batch without records
whose header says the number the engine's next record would have had (`next_seq`): records
dropped at the very end of a stream leave no gap before a later record, and this is how the
collector still sees them.

The transport owns its ZMQ context: a context shared with vLLM or the host program could be
terminated under it, or be one inherited across a fork, whose I/O thread is gone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Annotated, Any

import msgspec
import zmq
from zmq.utils.monitor import recv_monitor_message

from engine_hooks.buffer import EventBuffer
from engine_hooks.endpoint import TOKEN_USER, make_private_socket_folder
from engine_hooks.events import (
    NO_CONTROL_CHARACTERS,
    WIRE_FORMAT,
    BigCount,
    Count,
    DpRank,
    EngineId,
    Event,
    Label,
)

MAX_RECORDS_PER_BATCH = 50_000
DEFAULT_INTERVAL_S = 0.05  # one batch per interval
DEFAULT_MAX_BACKLOG_BYTES = 256 << 20
# The largest frame a collector accepts (ZMQ disconnects a peer that sends more, before
# anything is decoded); the transport splits a batch that would encode larger.
MAX_FRAME_BYTES = 16 << 20

logger = logging.getLogger("vllm.kvscope")  # vLLM's own handlers print it


class KvGroupSettings(msgspec.Struct, gc=False):
    """One KV cache group of the engine (`engine_hooks.layout.KvGroup`)."""

    kind: Label
    block_size: Annotated[int, msgspec.Meta(ge=1, le=1 << 20)]
    window: Count = 0
    num_layers: Count = 1


# A model's KV cache groups: a few in practice (one per attention kind and size).
MAX_KV_GROUPS = 64


class EngineSettings(msgspec.Struct, omit_defaults=True, gc=False):
    """The engine's cache settings: the run's configuration when a collector starts one."""

    block_size: Annotated[int, msgspec.Meta(ge=1, le=1 << 20)]
    num_blocks: Count
    hash_algo: Label
    vllm_version: Label
    model: Annotated[str, msgspec.Meta(max_length=4096, pattern=NO_CONTROL_CHARACTERS)] = ""
    max_num_seqs: Count = 0
    check_collisions: bool = False
    record_token_ids: bool = False
    kv_groups: Annotated[list[KvGroupSettings], msgspec.Meta(max_length=MAX_KV_GROUPS)] = []


class BatchHeader(msgspec.Struct, array_like=True, gc=False):
    """What the collector learns about the engine and the batch before it decodes it."""

    engine_id: EngineId
    dp_rank: DpRank
    batch_seq: BigCount
    num_records: Count
    num_lost_in_engine: BigCount
    num_dropped_in_transport: BigCount
    config: EngineSettings
    # In the closing batch (no records): the engine's next record number; every record
    # below it that never arrived is missing. 0 in every other batch.
    next_seq: BigCount = 0
    # `events.WIRE_FORMAT` of the hooks that sent it (hooks from before the field: 1).
    wire_format: Count = 1
    # Why the hooks stopped capturing this engine (a failure of their own, vLLM running on
    # uncaptured), in every batch sent after it; "" while they capture.
    capture_stopped: Label = ""
    # When this engine's hooks started sending (wall clock, ns): under one engine id and DP
    # rank, another value is the engine started again, its records numbered from 0 again
    # (KVSCOPE_ENGINE_ID kept across restarts); 0 from hooks before the field.
    started_ns: BigCount = 0
    # In the closing batch the engine sends as it shuts down: when it stopped, on the clock
    # of its records (its cache is gone from then on); 0 in every other batch, and from hooks
    # before the field.
    stopped_ns: BigCount = 0


class Ack(msgspec.Struct, array_like=True, gc=False):
    """These batches (of the engine the ack goes to) are stored."""

    batch_seqs: list[BigCount]


class Transport:
    """Background sender of an `EventBuffer`'s records over ZMQ."""

    def __init__(
        self,
        buffer: EventBuffer,
        endpoint: str,
        *,
        engine_id: str,
        dp_rank: int = 0,
        config: dict[str, Any] | None = None,
        lost_in_engine: Any = None,
        next_seq: Any = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        max_in_flight: int = 256,
        max_backlog_bytes: int = DEFAULT_MAX_BACKLOG_BYTES,
        token: bytes | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._buffer = buffer
        self._clock = clock  # the records' clock (the hooks'), for the time of the stop
        self.endpoint = endpoint
        self.engine_id = engine_id
        self.dp_rank = dp_rank
        self._settings = msgspec.convert(config or {}, EngineSettings)
        self._lost_in_engine = lost_in_engine or (lambda: 0)
        self._next_seq = next_seq
        self._interval_s = interval_s
        self._max_in_flight = max_in_flight
        self._max_backlog_bytes = max_backlog_bytes
        self._token = token
        self._encoder = msgspec.msgpack.Encoder()
        self._ack_decoder = msgspec.msgpack.Decoder(Ack)
        self._in_flight: deque[tuple[int, int, int]] = deque()  # batch, records, bytes
        self._backlog_bytes = 0
        self._next_batch = 0
        self.started_ns = time.time_ns()  # this engine start's, in every batch's header
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._context: zmq.Context[zmq.Socket[bytes]] | None = None
        self._socket: zmq.Socket[bytes] | None = None
        self._monitor: zmq.Socket[bytes] | None = None
        self.connected = False
        self.capture_stopped = ""  # set from the engine's thread: one str, read here
        self._stop_reported = False
        self.num_sent = 0
        self.num_delivered = 0
        self.num_dropped = 0

    def start(self) -> Transport:
        make_private_socket_folder(self.endpoint)
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.DEALER)
        if self._token is not None:
            self._socket.plain_username = TOKEN_USER
            self._socket.plain_password = self._token
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, self._max_in_flight)
        self._monitor = self._socket.get_monitor_socket(
            zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED
        )
        self._socket.connect(self.endpoint)
        self._thread = threading.Thread(target=self._run, name="kvscope-transport", daemon=True)
        self._thread.start()
        return self

    def stop(self, flush_timeout_s: float = 5.0) -> None:
        """Send what is buffered, wait up to `flush_timeout_s` for acks while a collector is
        connected, count what is still unacknowledged as dropped, then close."""
        if self._thread is None:
            return
        self._stopping.set()
        self._thread.join()
        self._thread = None
        assert self._socket is not None and self._monitor is not None
        self._send_pending()
        self._send_closing(stopped_ns=self._clock())
        deadline = time.monotonic() + flush_timeout_s
        while self._in_flight and time.monotonic() < deadline:
            self._watch_connection()
            if not self.connected:
                break
            if self._socket.poll(50):
                self._receive_acks()
        self.num_dropped += self.num_in_flight
        self._in_flight.clear()
        self._backlog_bytes = 0
        self._socket.disable_monitor()
        self._monitor.close(linger=0)
        self._socket.close(linger=0)
        assert self._context is not None
        self._context.term()
        self._socket = self._monitor = self._context = None

    @property
    def num_in_flight(self) -> int:
        return sum(count for _, count, _ in self._in_flight)

    def _run(self) -> None:
        # One batch per interval, however many records arrive in it: the batch rate, and so
        # the time `max_in_flight` batches give a stalled collector, does not depend on load.
        while not self._stopping.wait(self._interval_s):
            self._watch_connection()
            self._send_pending()
            if self.capture_stopped and not self._stop_reported:
                self._stop_reported = True
                self._send_closing()  # the stream ends here, and the header says why
            self._receive_acks()

    def report_stopped(self, reason: str) -> None:
        """The hooks stopped capturing (`PoolHooks.failed`): the next batch tells the
        collector why, and where the stream ends. Returns at once (the engine's thread)."""
        self.capture_stopped = reason

    def _watch_connection(self) -> None:
        assert self._monitor is not None
        while self._monitor.poll(0):
            connected = recv_monitor_message(self._monitor)["event"] == zmq.EVENT_CONNECTED
            if connected != self.connected:
                logger.info(
                    "kvscope: %s the collector at %s",
                    "connected to" if connected else "lost",
                    self.endpoint,
                )
            self.connected = connected

    def _send_pending(self) -> None:
        records = self._buffer.take()
        for start in range(0, len(records), MAX_RECORDS_PER_BATCH):
            self._send(records[start : start + MAX_RECORDS_PER_BATCH])

    def _send(self, records: list[Event]) -> None:
        if len(self._in_flight) >= self._max_in_flight:
            self.num_dropped += len(records)  # the collector is not keeping up
            return
        encoded = self._encoder.encode(records)
        if len(encoded) > MAX_FRAME_BYTES:
            if len(records) == 1:
                self.num_dropped += 1  # one record larger than a collector accepts
                return
            half = len(records) // 2
            self._send(records[:half])
            self._send(records[half:])
            return
        if self._in_flight and self._backlog_bytes + len(encoded) > self._max_backlog_bytes:
            self.num_dropped += len(records)  # the backlog is full
            return
        if not self._ship(encoded, len(records)):
            self.num_dropped += len(records)  # ZMQ's queue is full

    def _send_closing(self, stopped_ns: int = 0) -> None:
        """Tell the collector where the stream ends (tiny: it goes past the bounds), and
        with `stopped_ns`, that the engine stopped then. If ZMQ's queue is full, no collector
        takes anything now: the run file cannot learn it anyway."""
        if self._next_seq is not None or self.capture_stopped:
            next_seq = self._next_seq() if self._next_seq is not None else 0
            self._ship(self._encoder.encode([]), 0, next_seq=next_seq, stopped_ns=stopped_ns)

    def _ship(
        self, encoded: bytes, num_records: int, next_seq: int = 0, stopped_ns: int = 0
    ) -> bool:
        """Send one batch's header and encoded records without waiting, and count it in
        flight; False if ZMQ's queue is full."""
        assert self._socket is not None
        header = BatchHeader(
            self.engine_id,
            self.dp_rank,
            self._next_batch,
            num_records,
            self._lost_in_engine(),
            self.num_dropped,
            self._settings,
            next_seq,
            WIRE_FORMAT,
            self.capture_stopped,
            self.started_ns,
            stopped_ns,
        )
        try:
            self._socket.send_multipart(
                [self._encoder.encode(header), encoded], flags=zmq.NOBLOCK, copy=False
            )
        except zmq.Again:
            return False
        self._in_flight.append((self._next_batch, num_records, len(encoded)))
        self._backlog_bytes += len(encoded)
        self._next_batch += 1
        self.num_sent += num_records
        return True

    def _receive_acks(self) -> None:
        assert self._socket is not None
        while self._socket.poll(0):
            try:
                acked = set(self._ack_decoder.decode(self._socket.recv()).batch_seqs)
            except msgspec.DecodeError:
                continue  # not from a kvscope collector: the engine does not trust it
            newest = max(acked, default=-1)
            while self._in_flight and self._in_flight[0][0] <= newest:
                batch_seq, num_records, num_bytes = self._in_flight.popleft()
                self._backlog_bytes -= num_bytes
                if batch_seq in acked:
                    self.num_delivered += num_records
                else:  # a later batch got through first: this one never will
                    self.num_dropped += num_records
