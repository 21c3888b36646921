"""The app follows a run while `kvscope collect` writes it, without a lock error, and shows
each newer live copy as it is published."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from collector.queries.summary import run_summary
from collector.store.run_file import RunBeingWritten, RunFile, RunStore, live_copy_path
from tests.support.app import metrics, start
from tests.support.engine import collector_process, replay_to_collector, wait_for

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version


def copy_requests(run: Path) -> int:
    """The requests in the live copy published now (each copy opened afresh)."""
    with RunFile.open_live_copy(live_copy_path(run)) as copy:
        return int(run_summary(copy)["requests"])


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

        # A second engine's records: newer copies replace the one the app holds open.
        more_hooks, more_transport = replay_to_collector(endpoint, 200, engine_id="test-2")
        wait_for(lambda: copy_requests(run) == 320)
        app.run()  # the sidebar sees the newer copy and reruns the app, as in a browser
        app.run()
        assert not app.exception, app.exception
        assert metrics(app)["Requests"] == "320", "the whole run, as it grew"

        for stopped_transport, stopped_hooks in ((transport, hooks), (more_transport, more_hooks)):
            stopped_transport.stop()
            stopped_hooks.detach()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    assert not live_copy_path(run).exists(), "the live copy goes away with the collector"
    store = RunStore.open(run)
    # Both engines served the sample trace's first requests: 200 request ids in all.
    assert store.row("SELECT count(*) FROM requests") == (200,)
    store.close()
