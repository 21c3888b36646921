"""vLLM's real KV event pipeline in one process, for tests: a real `KVCacheManager` with KV
events on, vLLM's real `ZmqEventPublisher` on ipc:// sockets, kvscope's subscriber."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import msgspec
import zmq

from collector.live.vllm_kv_subscriber import VllmKvEventSubscriber
from collector.model.step_model import StepModel
from collector.replay.block_manager import (
    CacheSettings,
    make_block_hasher,
    make_kv_cache_manager,
    require_vllm,
)
from collector.replay.simulator import Simulator, VirtualClock
from collector.replay.traces import read_trace
from collector.store.run_file import RunConfig, RunStore
from collector.vllm_kv.conflicts import HashConflictDetector
from collector.vllm_kv.ingest import append_vllm_batches
from collector.vllm_kv.wire import BlockStored, KVEventBatch, ReceivedBatch, WireEvent, decode_batch
from tests.support.engine import collector_process
from tests.support.repo import SAMPLE_TRACE

TOPIC = "kvscope-test"
FIRST_TS = 1_000.0  # the engine's wall clock (s) at the first step
STEP_S = 0.5


@contextmanager
def checked_sockets() -> Iterator[Path]:
    """A socket directory for one test; after it, no ZMQ socket of the process is open."""
    with socket_directory() as directory:
        yield directory
    # pyzmq's context keeps a weak set of its sockets; closing one removes it.
    still_open = [socket for socket in zmq.Context.instance()._sockets if not socket.closed]
    assert still_open == [], "a test left ZMQ sockets open"


@contextmanager
def socket_directory() -> Iterator[Path]:
    """A short directory for ipc:// sockets (their paths must stay under ~100 bytes)."""
    directory = Path(tempfile.mkdtemp(prefix="kv", dir="/tmp"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextmanager
def zmq_publisher(directory: Path, replay: bool = True, **options: Any) -> Iterator[Any]:
    """vLLM's own ZmqEventPublisher bound to ipc:// sockets in `directory`, shut down after."""
    from vllm.distributed.kv_events import ZmqEventPublisher  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    publisher = ZmqEventPublisher(
        0,
        endpoint=f"ipc://{directory}/events",
        replay_endpoint=f"ipc://{directory}/replay" if replay else None,
        topic=TOPIC,
        **options,
    )
    try:
        yield publisher
    finally:
        publisher.shutdown()
        assert not publisher._thread.is_alive(), "vLLM's publisher thread must stop"


def subscriber_for(directory: Path, replay: bool = True, **options: Any) -> VllmKvEventSubscriber:
    return VllmKvEventSubscriber(
        f"ipc://{directory}/events",
        f"ipc://{directory}/replay" if replay else None,
        TOPIC,
        **options,
    )


def wait_until_sent(publisher: Any, timeout_s: float = 30) -> None:
    """Block until vLLM's publisher thread has sent (and buffered) every queued batch.

    Its queue's `task_done` comes right after the send and the append to the replay buffer.
    """
    deadline = time.monotonic() + timeout_s
    while publisher._event_queue.unfinished_tasks:
        if time.monotonic() > deadline:
            raise AssertionError("vLLM's publisher did not send its queue")
        time.sleep(0.005)


def receive(
    subscriber: VllmKvEventSubscriber, count: int, timeout_s: float = 30
) -> list[ReceivedBatch]:
    """Poll until `count` batches came, live or healed; when nothing arrives for a moment
    (every batch went out before the subscription took hold), ask the replay socket."""
    received: list[ReceivedBatch] = []
    deadline = time.monotonic() + timeout_s
    while len(received) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"received {len(received)} of {count} batches")
        arrived = subscriber.poll(100)
        received += arrived or subscriber.catch_up()
    return received


class EventSource:
    """vLLM's KVCacheManager with KV events on, publishing each step's events as one
    KVEventBatch (as vLLM's scheduler does: only steps that have events)."""

    def __init__(
        self,
        publisher: Any,
        settings: CacheSettings,
        hash_fn: Callable[[Any], bytes] | None = None,
    ) -> None:
        self.publisher = publisher
        self.manager = make_kv_cache_manager(settings, kv_events=True)
        self.block_hasher = make_block_hasher(settings)
        if hash_fn is not None:
            from vllm.v1.core.kv_cache_utils import get_request_block_hasher  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

            self.block_hasher = get_request_block_hasher(settings.block_size, hash_fn)
        self.published: list[list[Any]] = []
        self.hit_tokens: dict[str, int] = {}
        self.ts = FIRST_TS

    def step(self) -> None:
        """End an engine step: publish its events, if any, stamped with this step's time."""
        from vllm.distributed.kv_events import KVEventBatch  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

        events = self.manager.take_events()
        if events:
            self.publisher.publish(KVEventBatch(ts=self.ts, events=events))
            self.published.append(events)
        self.ts += STEP_S

    def replay(self, trace_path: Path, limit: int | None = None) -> None:
        """Push a trace through kvscope's step model (timestamps timing, 32 running at most),
        one KVEventBatch per step stamped with the trace's clock."""
        clock = VirtualClock()

        def end_step() -> None:
            self.ts = FIRST_TS + clock() / 1e9
            self.step()

        simulator = Simulator(self.manager, None, clock, self.block_hasher, on_step=end_step)
        trace = read_trace(trace_path)[:limit]
        simulator.run_timestamps(trace, 32, StepModel(), progress=lambda _: None)

    def request(self, request_id: str, token_ids: list[int], report_mode: str | None = None) -> Any:
        """A vLLM Request; `report_mode="full"` is SamplingParams(extra_args={...})."""
        from vllm.sampling_params import SamplingParams  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
        from vllm.v1.request import Request  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

        extra_args = None if report_mode is None else {"kv_cache_report_mode": report_mode}
        return Request(
            request_id,
            token_ids,
            SamplingParams(max_tokens=8, extra_args=extra_args),
            None,
            block_hasher=self.block_hasher,
        )

    def serve(
        self,
        request_id: str,
        token_ids: list[int],
        output_ids: Sequence[int] = (),
        report_mode: str | None = None,
    ) -> Any:
        """Prefill (one step), decode one token per step, free (one step), as the
        scheduler calls the manager; returns the request."""
        request = self.request(request_id, token_ids, report_mode)
        blocks, num_hit_tokens, _ = self.manager.get_computed_blocks(request)
        self.hit_tokens[request_id] = num_hit_tokens
        new_tokens = request.num_tokens - num_hit_tokens
        assert self.manager.allocate_slots(request, new_tokens, num_hit_tokens, blocks)
        request.num_computed_tokens = request.num_tokens
        self.step()
        for token_id in output_ids:
            request.append_output_token_ids([token_id])
            assert self.manager.allocate_slots(request, 1) is not None
            request.num_computed_tokens += 1
            self.step()
        self.manager.free(request)
        self.step()
        return request


def low64(block_hash: bytes) -> int:
    """vLLM's 64-bit form of one of its own block hashes."""
    return int.from_bytes(block_hash[-8:], "big")


def events_run(path: Path, settings: CacheSettings) -> RunStore:
    """A new run file for what a `kvscope collect --vllm-kv-events` session would store."""
    config = RunConfig(
        source="vllm-kv-events",
        block_size=settings.block_size,
        num_blocks=settings.num_blocks,
        hash_algo="sha256",
        vllm_version=require_vllm(),
    )
    return RunStore.create(path, config)


def replay_sample(
    sockets: Path,
    run: RunStore,
    source_settings: CacheSettings,
    *,
    limit: int | None = None,
    hash_fn: Callable[[Any], bytes] | None = None,
    then_reset: bool = False,
) -> tuple[EventSource, HashConflictDetector]:
    """The sample trace (its first `limit` requests) through vLLM's manager -> publisher ->
    subscriber -> run file; with `then_reset`, a prefix cache reset after it, as one more step."""
    detector = HashConflictDetector()
    with zmq_publisher(sockets) as publisher, subscriber_for(sockets) as subscriber:
        source = EventSource(publisher, source_settings, hash_fn=hash_fn)
        source.replay(SAMPLE_TRACE, limit=limit)
        if then_reset:
            assert source.manager.reset_prefix_cache()
            source.step()
        wait_until_sent(publisher)
        batches = receive(subscriber, len(source.published))
        append_vllm_batches(run, batches, subscriber.take_gaps(), detector)
    return source, detector


PROBE_TOKEN_BASE = 900_000


def serve_until_received(
    source: EventSource, subscriber: VllmKvEventSubscriber, timeout_s: float = 30
) -> list[ReceivedBatch]:
    """Serve fresh one-block prompts, one at a time, until a poll returns batches (the
    subscription has taken hold); returns what that poll returned."""
    deadline = time.monotonic() + timeout_s
    index = 0
    while time.monotonic() < deadline:
        tokens = [PROBE_TOKEN_BASE + index * 4 + offset for offset in range(4)]
        source.serve(f"probe-{index}", tokens)
        wait_until_sent(source.publisher)
        received = subscriber.poll(100)
        if received:
            return received
        index += 1
    raise AssertionError("no batch arrived live")


H = 0xDEADBEEF_00C0FFEE


def received(seq: int, *events: WireEvent, dp_rank: int = 0, epoch: int = 0) -> ReceivedBatch:
    batch = KVEventBatch(ts=10.0 + seq, events=list(events), data_parallel_rank=dp_rank)
    return ReceivedBatch("ipc://test", epoch, seq, batch, replayed=False)


def stored(
    block_hash: int | bytes,
    tokens: list[int],
    *,
    parent: int | None = None,
    group_idx: int = 0,
    medium: str = "GPU",
    extra_keys: list[Any] | None = None,
) -> BlockStored:
    return BlockStored(
        block_hashes=[block_hash],
        parent_block_hash=parent,
        token_ids=tokens,
        block_size=len(tokens),
        medium=medium,
        group_idx=group_idx,
        extra_keys=None if extra_keys is None else [encoded(keys) for keys in extra_keys],
    )


def encoded(keys: Any) -> msgspec.Raw:
    """One block's extra keys as a decoded batch holds them: encoded, as vLLM sent them."""
    return msgspec.Raw(msgspec.msgpack.encode(keys))


def through_the_wire(vllm_batches: Sequence[Any], epoch: int = 0) -> list[ReceivedBatch]:
    """vLLM's own KVEventBatch objects packed as vLLM's ZmqEventPublisher packs them and
    decoded by kvscope's wire decoder: one stream's batches 0, 1, ..., as they arrive live."""
    encoder = msgspec.msgpack.Encoder()  # vLLM's publisher: `self._pack.encode(event)`
    return [
        ReceivedBatch("ipc://test", epoch, seq, decode_batch(encoder.encode(batch)), False)
        for seq, batch in enumerate(vllm_batches)
    ]


@contextmanager
def subscribed_collector(directory: Path, *options: str) -> Iterator[tuple[Any, Any, Path]]:
    """vLLM's publisher and a `kvscope collect` subscribed to it, with more `options`:
    (publisher, process, run)."""
    with ExitStack() as stack:
        publisher = stack.enter_context(zmq_publisher(directory))
        run = directory / "run.duckdb"
        process = stack.enter_context(
            collector_process(
                run,
                f"ipc://{directory}/hooks",
                *("--vllm-kv-events", f"ipc://{directory}/events"),
                *("--vllm-kv-replay", f"ipc://{directory}/replay"),
                *("--vllm-kv-topic", TOPIC),
                *options,
            )
        )
        yield publisher, process, run
