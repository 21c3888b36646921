"""Engine in the loop: vLLM's real Scheduler with kvscope's plugin loaded as vLLM loads it,
a real `kvscope collect` process over the real socket, and the run file it writes."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from collector.queries.summary import run_summary
from collector.store.run_file import RunFile, RunStore
from engine_hooks.buffer import EventBuffer
from engine_hooks.events import Event, Lookup
from tests.support.engine import (
    BLOCK_SIZE,
    KILL_AFTER_STEPS,
    collector_process,
    drive,
    kill_collector_mid_run,
    make_scheduler,
    stored_record_numbers,
    workload,
    workload_scheduler,
)

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version


def spy_on_lookups(buffer: EventBuffer, monkeypatch: pytest.MonkeyPatch) -> list[Lookup]:
    """Every `Lookup` record the engine's buffer accepts from the hooks, as they pass."""
    lookups: list[Lookup] = []
    offer = buffer.offer

    def offer_and_keep(records: list[Event]) -> bool:
        accepted = offer(records)
        if accepted:
            lookups.extend(record for record in records if isinstance(record, Lookup))
        return accepted

    monkeypatch.setattr(buffer, "offer", offer_and_keep)
    return lookups


def stored_seqs(run: Path) -> tuple[int, int]:
    """How many records the run file holds, and the highest record number (-1: none)."""
    numbers = stored_record_numbers(run)
    return len(numbers), numbers[-1] if numbers else -1


def test_every_event_reaches_duckdb_through_the_collector(
    tmp_path: Path, capture_environment: str
) -> None:
    run = tmp_path / "run.duckdb"
    rows = workload()
    with collector_process(run, capture_environment) as process:
        scheduler = workload_scheduler(tmp_path / "model")
        capture = scheduler.kvscope_capture
        result = drive(scheduler, rows, per_step=3)
        scheduler.shutdown()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    hooks, transport = capture.hooks, capture.transport
    assert result.finished == len(rows)
    assert hooks.num_lost == 0 and transport.num_dropped == 0
    assert transport.num_delivered == hooks.num_records
    assert stored_seqs(run) == (hooks.num_records, hooks.num_records - 1), "no gaps"

    store = RunStore.open(run)
    summary = run_summary(store)
    preempted = store.row(
        "SELECT coalesce(sum(num_prompt_tokens), 0), coalesce(sum(num_hit_tokens), 0) "
        "FROM events WHERE kind = 'lookup' AND preempted"
    )
    requests = store.row(
        "SELECT count(*), count(first_scheduled_ns), count(finished_ns), count(tenant) "
        "FROM requests"
    )
    store.close()
    assert summary["requests"] == len(rows)
    assert summary["hit_tokens"] > 0, "the workload shares prefixes"
    assert (summary["prompt_tokens"], summary["hit_tokens"]) == (result.queries, result.hits)
    assert preempted == (result.preempted_queries, result.preempted_hits)
    assert summary["dropped_events"] == 0 and summary["collisions"] == 0
    assert requests == (len(rows), len(rows), len(rows), len(rows))


def test_killed_collector_loses_exactly_what_the_engine_counts(
    tmp_path: Path, capture_environment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSCOPE_FLUSH_TIMEOUT_S", "1")
    run = tmp_path / "run.duckdb"
    rows = workload()
    with collector_process(run, capture_environment) as process:
        scheduler = workload_scheduler(tmp_path / "model")
        capture = scheduler.kvscope_capture
        transport = capture.transport
        lookups = spy_on_lookups(capture.buffer, monkeypatch)
        first = kill_collector_mid_run(process, scheduler, rows)
        rest = drive(scheduler, rows[KILL_AFTER_STEPS * 3 :], per_step=3)
        scheduler.shutdown()
    hooks = capture.hooks
    assert first.finished + rest.finished == len(rows), "the engine finished every step"
    not_delivered = hooks.num_lost + transport.num_dropped
    assert not_delivered > 0
    stored = set(stored_record_numbers(run))
    assert len(stored) == hooks.num_records - not_delivered
    assert transport.num_delivered == len(stored)

    store = RunStore.open(run)  # reopens cleanly after the kill
    admitted = [record for record in lookups if not record.preempted and record.seq in stored]
    assert admitted, "the collector stored some first admissions before it was killed"
    assert run_summary(store)["requests"] == len(admitted)
    store.close()


def test_two_engines_in_one_run_keep_their_records_apart(
    tmp_path: Path, capture_environment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run.duckdb"
    rows = workload()
    captures = {}
    with collector_process(run, capture_environment) as process:
        for engine, share in (("engine-a", rows[:60]), ("engine-b", rows[60:150])):
            monkeypatch.setenv("KVSCOPE_ENGINE_ID", engine)
            scheduler = make_scheduler(
                tmp_path / engine, BLOCK_SIZE, num_blocks=300, max_num_seqs=8
            )
            drive(scheduler, share, per_step=3)
            scheduler.shutdown()
            captures[engine] = scheduler.kvscope_capture
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    with RunFile.open(run) as run_file:
        records = dict(
            run_file.rows(
                "SELECT engine_id, count(DISTINCT seq) FROM ("
                " SELECT engine_id, seq FROM events WHERE kind <> 'drop'"
                " UNION ALL SELECT engine_id, seq FROM pool) GROUP BY ALL"
            )
        )
        requests = dict(
            run_file.rows(
                "SELECT engine_id, count(DISTINCT request_id) FROM events"
                " WHERE kind = 'finish' GROUP BY ALL"
            )
        )
    assert records == {engine: capture.hooks.num_records for engine, capture in captures.items()}
    assert requests == {"engine-a": 60, "engine-b": 90}
