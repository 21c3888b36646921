"""The live copy (collector/store/live_copy.py): made on a thread of its own while the writer
goes on appending, it holds the run file as of the writer's last checkpoint, and its derived
tables are those of its own events; a collector killed while making one publishes copies
again when it is resumed."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from collector.replay.block_manager import CacheSettings
from collector.store.live_copy import LiveCopy
from collector.store.run_file import (
    RunConfig,
    RunFile,
    RunStore,
    live_copy_draft_path,
    live_copy_path,
)
from tests.support.block_manager import sample_engine_steps
from tests.support.engine import collector_process, replay_to_collector, wait_for

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version

SETTINGS = CacheSettings(block_size=16, num_blocks=300)
CONFIG = RunConfig("test", SETTINGS.block_size, SETTINGS.num_blocks, "sha256", "test")
BULK_ROWS = 400_000  # over three of DuckDB's row groups: written to the file, not the log


class PausedHalfway(RunStore):
    """A run store whose copy stops halfway through the file until the test lets it go on."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.halfway = threading.Event()
        self.go_on = threading.Event()
        self.pause_at = 0

    def _read_chunk(self, offset: int) -> bytes:
        if offset >= self.pause_at and not self.halfway.is_set():
            self.halfway.set()
            assert self.go_on.wait(60)
        return super()._read_chunk(offset)[: 1 << 16]


def counts(run: RunFile) -> dict[str, int]:
    row = run.row(
        "SELECT count(*), count(DISTINCT request_id) FILTER (WHERE kind = 'arrive'),"
        " count(*) FILTER (WHERE kind = 'store') FROM events"
    )
    assert row is not None
    requests = run.row("SELECT count(*) FROM requests")
    stores = run.row("SELECT count(*) FROM cache_lifetimes")
    assert requests is not None and stores is not None
    return {
        "events": row[0],
        "requests arrived": row[1],
        "requests derived": requests[0],
        "stores": row[2],
        "stores derived": stores[0],
    }


def test_the_copy_is_the_last_checkpoint_while_the_writer_appends(tmp_path: Path) -> None:
    store = PausedHalfway.create(tmp_path / "run.duckdb", CONFIG)
    for records in sample_engine_steps(SETTINGS, 150, "a"):
        store.append(records)
    store.flush()
    live = LiveCopy(store, threads=1, memory_limit="1GB")
    # More engines' worth, to append while the copy is read: big enough that DuckDB writes
    # its row groups into the file's free blocks at once (optimistic writes), not the log.
    row = store.row("SELECT count(*) FROM events")
    assert row is not None
    copies = BULK_ROWS // row[0] + 1
    bulk = store.arrow(
        "SELECT events.* REPLACE (concat('bulk', copy) AS engine_id)"
        f" FROM events, range({copies}) AS copies(copy)"
    )
    store.checkpoint()
    store.pause_at = store.path.stat().st_size // 2
    assert live.publish()  # folds, checkpoints, and starts the copy
    assert store.halfway.wait(60)
    checkpointed = counts(store)
    size_before = store.path.stat().st_size
    assert not live.publish(), "no checkpoint (and no new copy) while a copy is read"
    store.insert({"events": bulk})
    grown = store.path.stat().st_size
    store.go_on.set()
    live.wait()
    assert live.failures == []
    assert grown > size_before, "the appends reached the file itself while it was copied"
    with RunFile.open(live.path) as copy:
        copied = counts(copy)
    assert copied == checkpointed | {
        "requests derived": checkpointed["requests arrived"],
        "stores derived": checkpointed["stores"],
    }
    assert counts(store)["events"] == checkpointed["events"] + bulk.num_rows
    live.close()
    store.finalize()
    store.close()
    assert not live.path.exists(), "finalizing removes the live copy"


def test_closing_stops_a_copy_and_leaves_nothing_half_made(tmp_path: Path) -> None:
    store = PausedHalfway.create(tmp_path / "run.duckdb", CONFIG)
    for records in sample_engine_steps(SETTINGS, 40, "a"):
        store.append(records)
    live = LiveCopy(store, threads=1, memory_limit="1GB")
    assert live.publish()
    assert store.halfway.wait(60)
    # The copy goes on half a second after `close` began: it finds the collector closing.
    threading.Timer(0.5, store.go_on.set).start()
    live.close()
    assert not live.busy
    assert live.failures == [] and live.published == 0
    assert not live.path.exists()
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []
    store.finalize()
    store.close()


def left_by_a_killed_copy(run: Path) -> None:
    """What a collector killed while rebuilding a live copy leaves: the copy being made and
    DuckDB's write-ahead log beside it, written by a process that is then SIGKILLed."""
    draft = live_copy_draft_path(run)
    script = (
        "import os, shutil, signal, sys, duckdb\n"
        "shutil.copyfile(sys.argv[1], sys.argv[2])\n"
        "connection = duckdb.connect(sys.argv[2])\n"
        "connection.execute(\"SET wal_autocheckpoint = '1TB'\")\n"
        "connection.execute('CREATE OR REPLACE TABLE requests AS SELECT * FROM requests')\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    killed = subprocess.run([sys.executable, "-c", script, str(run), str(draft)], check=False)
    assert killed.returncode == -signal.SIGKILL
    assert draft.is_file() and draft.with_name(draft.name + ".wal").is_file()


def live_records_of(run: Path, engine_id: str) -> int:
    """The records of `engine_id` in the run's live copy (0 while there is none)."""
    if not live_copy_path(run).is_file():
        return 0
    with RunFile.open_live_copy(live_copy_path(run)) as live:
        row = live.row("SELECT count(*) FROM events WHERE engine_id = ?", [engine_id])
    return int(row[0]) if row else 0


def test_a_collector_killed_mid_copy_publishes_live_copies_again_when_resumed(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run.duckdb"
    endpoint = f"ipc://{tmp_path}/kvscope.ipc"
    with collector_process(run, endpoint) as collector:
        replay_to_collector(endpoint, 30, "first")
        wait_for(lambda: live_records_of(run, "first") > 0)
        collector.send_signal(signal.SIGKILL)
        collector.wait(timeout=60)
    left_by_a_killed_copy(run)
    with collector_process(run, endpoint) as collector:
        replay_to_collector(endpoint, 30, "second")
        wait_for(lambda: live_records_of(run, "second") > 0)  # a copy published since
        collector.send_signal(signal.SIGTERM)
        output, _ = collector.communicate(timeout=120)
    assert collector.returncode == 0, output
    assert "live copies failed" not in output, output
    assert not live_copy_path(run).exists(), "the finished run is read itself"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["kvscope.ipc", "run.duckdb"]
    with RunFile.open(run) as finished:
        assert finished.row("SELECT count(DISTINCT engine_id) FROM events") == (2,)
