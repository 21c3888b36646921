"""`kvscope collect --vllm-kv-events`: a real collector process subscribed to vLLM's real
ZmqEventPublisher, fed by a real KVCacheManager, writes what the events carry."""

from __future__ import annotations

import threading
from contextlib import ExitStack
from pathlib import Path

import pytest

from collector.live.receiver import Receiver
from collector.replay.block_manager import CacheSettings, make_kv_cache_manager
from collector.store.run_file import RunConfig, RunFile, RunStore, live_copy_path
from engine_hooks import EventBuffer, KVCacheHooks, Pseudonymizer
from engine_hooks.transport import Transport
from tests.support.engine import collector_process, replay_to_collector, stop_collector, wait_for
from tests.support.repo import SAMPLE_TRACE
from tests.support.vllm_kv_pipeline import (
    TOPIC,
    EventSource,
    socket_directory,
    subscribed_collector,
    wait_until_sent,
    zmq_publisher,
)

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version


def published_blocks(source: EventSource, kind: str) -> int:
    """Blocks the source published in events of one kind (`BlockStored`, `BlockRemoved`)."""
    return sum(
        len(event.block_hashes)
        for events in source.published
        for event in events
        if type(event).__name__ == kind
    )


def test_collector_stores_vllms_own_kv_events() -> None:
    with (
        socket_directory() as directory,
        subscribed_collector(directory, "--block-size", "16") as (publisher, process, run),
    ):
        source = EventSource(publisher, CacheSettings(16, 1_200))
        source.replay(SAMPLE_TRACE, limit=80)
        wait_until_sent(publisher)
        stored, removed = (
            published_blocks(source, "BlockStored"),
            published_blocks(source, "BlockRemoved"),
        )
        # No waiting: on SIGTERM the collector catches up through vLLM's replay socket.
        stop_collector(process)

        with RunFile.open(run) as run_file:
            rows = run_file.row(
                "SELECT count(*) FILTER (WHERE kind = 'stored'), "
                "count(*) FILTER (WHERE kind = 'removed') FROM vllm_kv_events"
            )
            batches = run_file.row("SELECT count(*) FROM vllm_kv_batches")
            gaps = run_file.row("SELECT count(*) FROM vllm_kv_gaps")
            source_name = run_file.row("SELECT source FROM runs")
    assert stored > 100 and removed > 0
    assert rows == (stored, removed)
    assert batches == (len(source.published),)
    assert gaps == (0,)
    assert source_name == ("vllm-kv-events",)


def test_an_engines_settings_replace_the_guesses_of_a_run_begun_by_kv_events() -> None:
    """vLLM's KV events do not say the pool's size or hash; when they reach the collector
    before the plugin's first batch, the run takes the engine's settings from that batch."""
    with ExitStack() as stack:
        directory = stack.enter_context(socket_directory())
        publisher = stack.enter_context(zmq_publisher(directory))
        run, hooks_endpoint = directory / "run.duckdb", f"ipc://{directory}/hooks"
        process = stack.enter_context(
            collector_process(
                run,
                hooks_endpoint,
                *("--live-interval", "0.2", "--vllm-kv-topic", TOPIC),
                *("--vllm-kv-events", f"ipc://{directory}/events"),
            )
        )
        EventSource(publisher, CacheSettings(16, 1_200)).replay(SAMPLE_TRACE, limit=5)
        wait_until_sent(publisher)
        wait_for(live_copy_path(run).is_file)  # stored: the run exists

        settings = CacheSettings(32, 640)
        buffer = EventBuffer()
        hooks = KVCacheHooks(
            make_kv_cache_manager(settings), buffer, pseudonymizer=Pseudonymizer(b"k")
        )
        hooks.record_pool_state()
        config = {
            "block_size": 32,
            "num_blocks": 640,
            "hash_algo": "sha256",
            "vllm_version": "0.33.0",
        }
        transport = Transport(buffer, hooks_endpoint, engine_id="e", config=config).start()
        wait_for(lambda: transport.num_delivered == 1)
        transport.stop()
        stop_collector(process)
        with RunFile.open(run) as run_file:
            row = run_file.row(
                "SELECT source, block_size, num_blocks, hash_algo, vllm_version,"
                " options->>'engine_id', options->>'endpoint' FROM runs"
            )
    assert row == ("engine", 32, 640, "sha256", "0.33.0", "e", f"ipc://{directory}/events")


def test_a_resumed_run_begun_by_kv_events_still_takes_the_engines_settings(
    tmp_path: Path,
) -> None:
    """A collector of vLLM's KV events killed before any engine batch came: restarted on the
    file, it still replaces its guesses with the first engine batch's settings."""
    run, endpoint = tmp_path / "run.duckdb", f"ipc://{tmp_path}/hooks"
    guesses = RunConfig(
        "vllm-kv-events", block_size=16, num_blocks=0, hash_algo="unknown", vllm_version="unknown"
    )
    RunStore.create(run, guesses).close()  # unfinished, as a killed collector leaves it
    receiver, stop = Receiver(run, endpoint, live_interval_s=0.2), threading.Event()
    serving = threading.Thread(target=receiver.serve, args=(stop,))
    serving.start()
    try:
        _, transport = replay_to_collector(endpoint, 5, engine_id="e")
        transport.stop()
    finally:
        stop.set()
        serving.join(timeout=60)
    store = RunStore.open(run)
    row = store.row("SELECT source, num_blocks, hash_algo FROM runs")
    store.close()
    assert row == ("engine", 2_000, "sha256")
