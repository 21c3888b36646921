"""The app follows a run while `kvscope collect` writes it, without a lock error."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from collector.block_manager import CacheSettings, make_block_hasher, make_kv_cache_manager
from collector.simulator import Simulator, VirtualClock
from collector.store import RunBeingWritten, RunStore, live_copy_path
from collector.traces import read_trace
from engine_hooks import EventBuffer, KVCacheHooks, Pseudonymizer
from engine_hooks.transport import Transport
from tests.conftest import REPO, SAMPLE_TRACE
from tests.engine import collector_process

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version


def wait_for(condition: object, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail("timed out")
        time.sleep(0.1)


def test_app_reads_the_live_copy_while_the_collector_writes(tmp_path: Path) -> None:
    run = tmp_path / "live.duckdb"
    endpoint = f"ipc://{tmp_path}/collect.ipc"
    with collector_process(run, endpoint) as process:
        settings = CacheSettings(16, 2_000)
        manager = make_kv_cache_manager(settings)
        buffer = EventBuffer()
        clock = VirtualClock()
        hooks = KVCacheHooks(manager, buffer, pseudonymizer=Pseudonymizer(b"k"), clock=clock)
        hooks.attach()
        config = {
            "block_size": 16,
            "num_blocks": 2_000,
            "hash_algo": "sha256",
            "vllm_version": "0.33.0",
            "model": "replayed",
        }
        transport = Transport(buffer, endpoint, engine_id="test", config=config).start()
        simulator = Simulator(manager, hooks, clock, make_block_hasher(settings), lambda: None)
        simulator.run_sequential(read_trace(SAMPLE_TRACE)[:120], lambda _: None)
        wait_for(lambda: transport.num_delivered == hooks.num_records)
        wait_for(live_copy_path(run).is_file)

        with pytest.raises(RunBeingWritten, match="another process is writing this run"):
            RunStore.open(run)
        app = AppTest.from_file(str(REPO / "visualizer" / "app.py"), default_timeout=60)
        app.session_state["run_path"] = str(run)
        app.run()
        assert not app.exception, app.exception
        metrics = {metric.label: metric.value for metric in app.metric}
        assert metrics["Requests"] == "120"
        assert any("live: following live.duckdb" in caption.value for caption in app.caption)

        transport.stop()
        hooks.detach()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    assert not live_copy_path(run).exists(), "the live copy goes away with the collector"
    store = RunStore.open(run)
    assert store.connection.execute("SELECT count(*) FROM requests").fetchone() == (120,)
    store.close()
