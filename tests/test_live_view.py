"""The app follows a run while `kvscope collect` writes it, without a lock error."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from collector.store.run_file import RunBeingWritten, RunStore, live_copy_path
from tests.support.app import metrics, start
from tests.support.engine import collector_process, replay_to_collector, wait_for

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version


def test_app_reads_the_live_copy_while_the_collector_writes(tmp_path: Path) -> None:
    run = tmp_path / "live.duckdb"
    endpoint = f"ipc://{tmp_path}/collect.ipc"
    with collector_process(run, endpoint) as process:
        hooks, transport = replay_to_collector(endpoint, 120, engine_id="test")
        wait_for(live_copy_path(run).is_file)

        with pytest.raises(RunBeingWritten, match="another process is writing this run") as error:
            RunStore.open(run)
        assert f"read its live copy instead, {live_copy_path(run)}," in str(error.value)
        app = start(run)
        assert metrics(app)["Requests"] == "120"
        assert any("live: following live.duckdb" in caption.value for caption in app.caption)

        transport.stop()
        hooks.detach()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    assert not live_copy_path(run).exists(), "the live copy goes away with the collector"
    store = RunStore.open(run)
    assert store.row("SELECT count(*) FROM requests") == (120,)
    store.close()
