"""`kvscope collect`: receives engines' record batches over ZMQ and writes one run file.

DuckDB allows one writing process per file, and while it writes, no other process can open
the file, not even read-only. So the receiver is the only process that opens the run file,
and for readers (the app's live view) it publishes a consistent copy, `RUN.duckdb.live`,
as often as every `live_interval_s` seconds while records arrive, made on a thread of its
own (collector/store/live_copy.py): readers never touch the file being written, and never
see a lock error. When the receiver stops, it finalizes the run file and removes the copy.

A batch is acknowledged to its engine only after its records are committed. Batches are
committed together, once COMMIT_BYTES of them wait or the oldest has waited
`commit_interval_s` (DuckDB appends rows in transactions of a million rows or more at about
half again the rate of 375 thousand, and several times that of 35 thousand), so an engine's
acknowledgements come up to that much later; its backlog covers many seconds of batches. A
gap in an
engine's record numbers (records its buffer refused, or batches lost on the way) is stored
as a `drop` record at the first missing number, saying how many records are missing.

What engines claim is bounded by the collector's own limits (`limits.py`, `kvscope collect
--limit`): a batch from an engine past the run's `engines`, or whose pool would take the
run's pools past `total-pool-blocks`, is refused, as is one the checks of `batch_check.py`
refuse (a pool over `pool-blocks`, a count of tokens over `tokens`, a replayed batch, a
jump in record numbers over `seq-jump`, a time out of range); each refusal is counted by
reason, and nothing of the batch is stored or acknowledged.

The same receiver can also subscribe to vLLM's own KV events (`VllmKvEventSubscriber`) and
store them in the same run file, from the same thread: DuckDB's one writer.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from collector.live.announced import keep_settings, keep_stop, kept_starts, run_config
from collector.live.batch_check import BatchDecoder, Rejections, check_sequence
from collector.live.engine_starts import EngineStarts
from collector.live.engine_stream import EngineStream, named_with_gaps
from collector.live.limits import Limits
from collector.live.listener import Listener
from collector.live.vllm_kv_subscriber import VllmKvEventSubscriber
from collector.model.rejected_message import RejectedMessage
from collector.store.live_copy import LiveCopy
from collector.store.run_file import RunConfig, RunStore, StoreError
from collector.store.segments import SegmentPolicy, Segments
from collector.vllm_kv.conflicts import HashConflictDetector
from collector.vllm_kv.ingest import append_vllm_batches
from engine_hooks.events import Event
from engine_hooks.transport import Ack, BatchHeader

BatchObserver = Callable[[BatchHeader, list[Event]], None]

COMMIT_BYTES = 16 << 20  # about a million block rows
# DuckDB's threads while engines run (inserts, live refreshes): with one, the collector takes
# about one core beside the engine (its own thread waits while DuckDB works). More would
# take CPU from the engine's process: on a 2-core machine, DuckDB's default (every core)
# cost a CPU replay 3 % more CPU time beside a collector (benchmarks/hooks_overhead.py).
INGEST_THREADS = 1
# DuckDB's memory while engines run and for the final rebuild. Its own default, 80 % of the
# machine's memory, is what a run of 100 million records took to rebuild its derived tables
# (19.7 GB resident on a 24 GB machine, benchmarks/large_run.py): the collector shares the
# host with vLLM, whose CPU swap and offloading tiers live in that memory too. At 6 GB the
# same rebuild spills to disk and completes.
INGEST_MEMORY_LIMIT = "6GB"
MEMORY_LIMIT = re.compile(r"\d+(\.\d+)?\s*(KB|MB|GB|TB|KiB|MiB|GiB|TiB)", re.IGNORECASE)


@dataclass
class ReceiverStats:
    batches: int = 0
    records: int = 0
    # Wall seconds spent taking engines' batches in (decode, check, convert, commit), and
    # the rows this collector wrote to the run file: its ingest rate.
    ingest_s: float = 0.0
    rows: int = 0
    commits: int = 0
    missing_records: int = 0
    snapshots: int = 0  # live copies published
    snapshots_carried: int = 0  # of them, those that carried tables over from the one before
    snapshot_failures: list[str] = field(default_factory=list)
    rejected: Rejections = field(default_factory=Rejections)
    engines: dict[tuple[str, int], EngineStream] = field(default_factory=dict)


class Receiver:
    """Binds a ROUTER socket and turns every batch it receives into rows of one run file."""

    def __init__(
        self,
        run_path: Path,
        endpoint: str,
        *,
        live_interval_s: float = 5.0,
        commit_interval_s: float = 2.0,
        observers: tuple[BatchObserver, ...] = (),
        kv_event_sources: tuple[VllmKvEventSubscriber, ...] = (),
        kv_event_run_config: RunConfig | None = None,
        allow_remote: bool = False,
        token: bytes | None = None,
        threads: int = INGEST_THREADS,
        memory_limit: str = INGEST_MEMORY_LIMIT,
        limits: Limits | None = None,
        segments: SegmentPolicy | None = None,
    ) -> None:
        self.run_path = run_path
        self._segment_policy = segments  # a segmented run (segments.py)
        self._segments: Segments | None = None
        self.limits = limits or Limits()
        self.threads = threads
        self.memory_limit = memory_limit
        self.endpoint = endpoint
        self.live_interval_s = live_interval_s
        self.commit_interval_s = commit_interval_s
        self.observers = observers
        self.stats = ReceiverStats()
        self.store: RunStore | None = None
        self._live_copy: LiveCopy | None = None
        self.kv_event_sources = kv_event_sources
        self._kv_event_run_config = kv_event_run_config
        self._conflicts = HashConflictDetector()
        self._decoder = BatchDecoder(self.limits)
        self._pool_blocks = 0  # of the engines admitted: their pools together
        self._starts = EngineStarts()
        self._encoder = msgspec.msgpack.Encoder()
        if run_path.exists():  # a run whose collector was killed: go on where it stopped
            self.store = self._open(RunStore.resume(run_path))
            for engine, (next_seq, last_ts_ns) in self.store.resumed.streams.items():
                self.stats.engines[engine] = EngineStream(next_seq, last_ts_ns)
            self._starts.resume(kept_starts(self.store))
            for source in kv_event_sources:
                source.resume_at(self.store.resumed.next_vllm_kv_batch)
        self._listener = Listener(endpoint, allow_remote=allow_remote, token=token)
        self._socket = self._listener.socket
        self._last_snapshot = time.monotonic()
        self._dirty = False
        self._unacknowledged: dict[bytes, list[int]] = {}  # stored, not yet committed
        self._first_unacknowledged_at = 0.0
        self._unacknowledged_bytes = 0
        # A run resumed keeps its settings unless vLLM's KV events began it (guesses).
        self._settings_from_engine = self.store is not None and self.store.source == "engine"

    def _open(self, store: RunStore) -> RunStore:
        """`store`, with this collector's limits, and its live copy set up."""
        store.limit_threads(self.threads)
        store.limit_memory(self.memory_limit)
        self._live_copy = LiveCopy(store, self.threads, self.memory_limit)
        if self._segment_policy is not None:
            self._segments = Segments(store, self._segment_policy, self._live_copy)
        return store

    def serve(self, stop: threading.Event, idle_exit_s: float | None = None) -> None:
        """Receive until `stop` is set (or nothing arrived for `idle_exit_s`), then finalize."""
        last_batch_at: float | None = None  # the idle clock starts with the first batch
        try:
            while not stop.is_set():
                wait_ms = 50 if self.kv_event_sources else 100
                received = bool(self._socket.poll(wait_ms)) and self._receive_available()
                received = self._receive_kv_events(poll_ms=wait_ms) or received
                if (
                    self._unacknowledged_bytes >= COMMIT_BYTES
                    or time.monotonic() - self._first_unacknowledged_at >= self.commit_interval_s
                ):
                    self._commit()
                    if self._segments is not None:
                        self._segments.close_if_due()
                if received:
                    last_batch_at = time.monotonic()
                elif (
                    idle_exit_s is not None
                    and last_batch_at is not None
                    and time.monotonic() - last_batch_at > idle_exit_s
                ):
                    break
                if self._dirty and time.monotonic() - self._last_snapshot > self.live_interval_s:
                    self.publish_snapshot()
            while self._receive_available():  # what is left, a commit's worth at a time
                self._commit()
            self._commit()
            for source in self.kv_event_sources:
                self._store_kv_events(source.catch_up(), source)
        finally:
            self.close()

    def _receive_kv_events(self, poll_ms: int) -> bool:
        """Store what vLLM's own KV event streams delivered (and any gaps they found)."""
        received = False
        for source in self.kv_event_sources:
            received = self._store_kv_events(source.poll(poll_ms), source) or received
        return received

    def _store_kv_events(self, batches: list[Any], source: VllmKvEventSubscriber) -> bool:
        gaps = source.take_gaps()
        if not batches and not gaps:
            return False
        if self.store is None:
            if self._kv_event_run_config is None:
                raise StoreError("vLLM KV events arrived, but no run configuration was given")
            self.store = self._open(RunStore.create(self.run_path, self._kv_event_run_config))
        self.store.flush()  # the engines' records first: one writer, one order
        append_vllm_batches(self.store, batches, gaps, self._conflicts)
        self._dirty = True
        return True

    def _receive_available(self) -> bool:
        """Take every waiting message; their acknowledgements wait for the next commit."""
        received = False
        started = time.perf_counter()
        while self._socket.poll(0) and self._unacknowledged_bytes < COMMIT_BYTES:
            frames = self._socket.recv_multipart()
            try:
                identity, sent, records = self._decoder.decode(frames)
                header = self._starts.named(sent, records, self._next_seq)
                stream = self._admit(header, records)
            except RejectedMessage as rejected:
                self.stats.rejected.count(rejected)
                continue
            self._starts.admitted(sent, header)
            self._store_batch(stream, header, records, sent.engine_id)
            if not self._unacknowledged:
                self._first_unacknowledged_at = time.monotonic()
            self._unacknowledged.setdefault(identity, []).append(header.batch_seq)
            self._unacknowledged_bytes += len(frames[-1])
            received = True
        self.stats.ingest_s += time.perf_counter() - started
        return received

    def _commit(self) -> None:
        """Commit what was received in one transaction, then acknowledge it."""
        if not self._unacknowledged:
            return
        if self.store is not None:  # None: only closing batches with nothing to store came
            started = time.perf_counter()
            self.store.flush()
            self.stats.ingest_s += time.perf_counter() - started
            self.stats.commits += 1
            self._dirty = True
        for identity, batch_seqs in self._unacknowledged.items():
            self._socket.send_multipart([identity, self._encoder.encode(Ack(batch_seqs))])
        self._unacknowledged = {}
        self._unacknowledged_bytes = 0

    def _next_seq(self, engine: tuple[str, int]) -> int | None:
        stream = self.stats.engines.get(engine)
        return None if stream is None else stream.next_seq

    def _admit(self, header: BatchHeader, records: list[Event]) -> EngineStream:
        """The stream of the batch's engine, once the batch is within the run's limits and
        follows what the run holds of it; raises RejectedMessage (and changes nothing) if
        not."""
        limits = self.limits
        engine = (header.engine_id, header.dp_rank)
        stream = self.stats.engines.get(engine)
        if stream is None and len(self.stats.engines) >= limits.engines:
            raise RejectedMessage(
                "engines",
                f"engine {header.engine_id!r} rank {header.dp_rank}: the run has "
                f"{limits.engines:,} engines and DP ranks already (kvscope collect --limit "
                "engines=N)",
            )
        num_blocks = header.config.num_blocks
        if stream is None or stream.num_blocks is None:
            if self._pool_blocks + num_blocks > limits.total_pool_blocks:
                raise RejectedMessage(
                    "total-pool-blocks",
                    f"engine {header.engine_id!r} rank {header.dp_rank}: its pool of "
                    f"{num_blocks:,} blocks takes the run's engines past "
                    f"{limits.total_pool_blocks:,} (kvscope collect --limit total-pool-blocks=N)",
                )
        elif num_blocks != stream.num_blocks:
            raise RejectedMessage(
                "inconsistent",
                f"engine {header.engine_id!r} rank {header.dp_rank}: a pool of {num_blocks:,} "
                f"blocks, where its batches before said {stream.num_blocks:,}",
            )
        check_sequence(stream.next_seq if stream else 0, header, records, limits)
        if stream is None:
            stream = self.stats.engines[engine] = EngineStream()
        if stream.num_blocks is None:
            stream.num_blocks = num_blocks
            self._pool_blocks += num_blocks
        return stream

    def _store_batch(
        self, stream: EngineStream, header: BatchHeader, records: list[Event], announced_id: str
    ) -> None:
        """`announced_id`: the engine id the hooks sent (`header`'s is the run's name of the
        engine start: engine_starts.py)."""
        drops = named_with_gaps(stream, records, header)
        self.stats.batches += 1
        if header.capture_stopped and not stream.capture_stopped and self.store is not None:
            stream.capture_stopped = header.capture_stopped  # noted once per engine
            self.store.note_capture_stopped(
                header.engine_id, header.dp_rank, header.capture_stopped
            )
        if header.stopped_ns and self.store is not None:
            keep_stop(self.store, header, stream.next_seq, stream.last_ts_ns)
        if not records and not drops:  # an engine's closing batch, nothing missing: no rows
            for observe in self.observers if header.stopped_ns else ():
                observe(header, [])  # the engine's stop, for the exporter's gauges
            return
        if self.store is None:
            self.store = self._open(RunStore.create(self.run_path, run_config(header)))
        elif not self._settings_from_engine:
            # vLLM's KV events came first: the run was made with the collector's guesses
            # (no pool size, no hash algorithm); an engine's header knows them.
            self.store.update_config(run_config(header))
        self._settings_from_engine = True
        if not stream.settings_kept:
            keep_settings(self.store, header, announced_id)
            stream.settings_kept = True
        self.stats.missing_records += sum(drop.num_lost for drop in drops)
        self.stats.records += len(records)
        stored = self.store.append([*records, *drops])
        for observe in self.observers:
            observe(header, stored)

    def publish_snapshot(self) -> None:
        """Fold the new rows and checkpoint the run file, and start a new live copy of it
        when one is due; until one starts, the run stays dirty and the next interval tries
        again (a copy being made, or made a moment ago: `LiveCopy`)."""
        if self._live_copy is None:
            return
        if self._live_copy.publish():
            self._dirty = False
        self._last_snapshot = time.monotonic()

    def close(self) -> None:
        """Stop listening and finalize the run, even if stopping something fails first (the
        error is raised once the run is finalized and closed)."""
        try:
            self._listener.close()
            for source in self.kv_event_sources:
                source.close()
        finally:
            self._finish_run()

    def _finish_run(self) -> None:
        if self.store is None or self._live_copy is None:
            return
        try:
            self._live_copy.close()
        finally:
            self.stats.snapshots = self._live_copy.published
            self.stats.snapshots_carried = self._live_copy.carried
            self.stats.snapshot_failures = self._live_copy.failures
            try:
                self.store.finalize()
                self.stats.rows = self.store.num_rows
            finally:
                self.store.close()
                self.store = None
