"""Ships the hooks' records to `kvscope collect` from a background thread; never blocks vLLM.

Wire protocol (ZMQ DEALER -> the collector's ROUTER): each message is two frames, a msgpack
header (`BatchHeader`) and a msgpack list of records (`engine_hooks.events`). The collector
answers `Ack(batch_seq)` once every batch up to that one is committed to DuckDB.

A batch counts as delivered when it is acknowledged. A batch is dropped, and its records
counted in `num_dropped`, when it cannot be handed to ZMQ at once (no collector connected:
the socket is IMMEDIATE), when `max_in_flight` batches already await acknowledgement (the
collector is slow), or when it is still unacknowledged at `stop` after the flush timeout.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import msgspec
import zmq

from engine_hooks.buffer import EventBuffer
from engine_hooks.events import Event

MAX_RECORDS_PER_BATCH = 50_000


class BatchHeader(msgspec.Struct, array_like=True, gc=False):
    """What the collector learns about the engine and the batch before it decodes it."""

    engine_id: str
    dp_rank: int
    batch_seq: int
    num_records: int
    num_lost_in_engine: int
    num_dropped_in_transport: int
    config: dict[str, Any]


class Ack(msgspec.Struct, array_like=True, gc=False):
    """Every batch up to `batch_seq` is stored."""

    batch_seq: int


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
        interval_s: float = 0.05,
        max_in_flight: int = 256,
    ) -> None:
        self._buffer = buffer
        self.endpoint = endpoint
        self.engine_id = engine_id
        self.dp_rank = dp_rank
        self._config = config or {}
        self._lost_in_engine = lost_in_engine or (lambda: 0)
        self._interval_s = interval_s
        self._max_in_flight = max_in_flight
        self._encoder = msgspec.msgpack.Encoder()
        self._ack_decoder = msgspec.msgpack.Decoder(Ack)
        self._in_flight: deque[tuple[int, int]] = deque()
        self._next_batch = 0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socket: zmq.Socket[bytes] | None = None
        self.num_sent = 0
        self.num_delivered = 0
        self.num_dropped = 0

    def start(self) -> Transport:
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.IMMEDIATE, 1)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, self._max_in_flight)
        self._socket.connect(self.endpoint)
        self._thread = threading.Thread(target=self._run, name="kvscope-transport", daemon=True)
        self._thread.start()
        return self

    def stop(self, flush_timeout_s: float = 5.0) -> None:
        """Send what is buffered, wait up to `flush_timeout_s` for acks, then close."""
        if self._thread is None:
            return
        self._stopping.set()
        self._thread.join()
        self._thread = None
        assert self._socket is not None
        self._send_pending()
        deadline = time.monotonic() + flush_timeout_s
        while self._in_flight and time.monotonic() < deadline:
            if self._socket.poll(50):
                self._receive_acks()
        self.num_dropped += sum(count for _, count in self._in_flight)
        self._in_flight.clear()
        self._socket.close(linger=0)
        self._socket = None

    @property
    def num_in_flight(self) -> int:
        return sum(count for _, count in self._in_flight)

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._buffer.wait(self._interval_s)
            self._send_pending()
            self._receive_acks()

    def _send_pending(self) -> None:
        records = self._buffer.take()
        for start in range(0, len(records), MAX_RECORDS_PER_BATCH):
            self._send(records[start : start + MAX_RECORDS_PER_BATCH])

    def _send(self, records: list[Event]) -> None:
        assert self._socket is not None
        if len(self._in_flight) >= self._max_in_flight:
            self.num_dropped += len(records)  # the collector is not keeping up
            return
        header = BatchHeader(
            self.engine_id,
            self.dp_rank,
            self._next_batch,
            len(records),
            self._lost_in_engine(),
            self.num_dropped,
            self._config,
        )
        frames = [self._encoder.encode(header), self._encoder.encode(records)]
        try:
            self._socket.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.num_dropped += len(records)  # no collector connected
            return
        self._in_flight.append((self._next_batch, len(records)))
        self._next_batch += 1
        self.num_sent += len(records)

    def _receive_acks(self) -> None:
        assert self._socket is not None
        while self._socket.poll(0):
            ack = self._ack_decoder.decode(self._socket.recv())
            while self._in_flight and self._in_flight[0][0] <= ack.batch_seq:
                self.num_delivered += self._in_flight.popleft()[1]
