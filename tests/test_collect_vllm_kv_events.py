"""`kvscope collect --vllm-kv-events`: a real collector process subscribed to vLLM's real
ZmqEventPublisher, fed by a real KVCacheManager, writes what the events carry."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import duckdb
import pytest

from collector.block_manager import CacheSettings
from tests.conftest import REPO, SAMPLE_TRACE
from tests.vllm_kv_pipeline import (
    TOPIC,
    EventSource,
    socket_directory,
    wait_until_sent,
    zmq_publisher,
)

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version


def test_collector_stores_vllms_own_kv_events() -> None:
    with socket_directory() as directory, zmq_publisher(directory) as publisher:
        run = directory / "run.duckdb"
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "collector.cli",
                "collect",
                "--db",
                str(run),
                "--endpoint",
                f"ipc://{directory}/hooks",
                "--vllm-kv-events",
                f"ipc://{directory}/events",
                "--vllm-kv-replay",
                f"ipc://{directory}/replay",
                "--vllm-kv-topic",
                TOPIC,
                "--block-size",
                "16",
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert process.stdout is not None
        assert "listening" in process.stdout.readline()
        source = EventSource(publisher, CacheSettings(16, 1_200))
        source.replay(SAMPLE_TRACE, limit=80)
        wait_until_sent(publisher)
        stored = sum(
            len(event.block_hashes)
            for events in source.published
            for event in events
            if type(event).__name__ == "BlockStored"
        )
        removed = sum(
            len(event.block_hashes)
            for events in source.published
            for event in events
            if type(event).__name__ == "BlockRemoved"
        )
        # No waiting: on SIGTERM the collector catches up through vLLM's replay socket.
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0

        with duckdb.connect(str(run), read_only=True) as connection:
            rows = connection.execute(
                "SELECT count(*) FILTER (WHERE kind = 'stored'), "
                "count(*) FILTER (WHERE kind = 'removed') FROM vllm_kv_events"
            ).fetchone()
            batches = connection.execute("SELECT count(*) FROM vllm_kv_batches").fetchone()
            gaps = connection.execute("SELECT count(*) FROM vllm_kv_gaps").fetchone()
            source_name = connection.execute("SELECT source FROM runs").fetchone()
    assert stored > 100 and removed > 0
    assert rows == (stored, removed)
    assert batches == (len(source.published),)
    assert gaps == (0,)
    assert source_name == ("vllm-kv-events",)
