"""An engine started again under the same engine id (KVSCOPE_ENGINE_ID kept across restarts
of vLLM) numbers its records from 0 again. The collector takes it as another engine of the
run, "ID #2", as it takes a restart under a new id (host:pid), by the hooks' `started_ns`:
nothing of it is refused as replayed, a batch one start sent twice still is, and a collector
killed and restarted on the run goes on naming each start as before."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import duckdb

from collector.health.scorecard import scorecard
from collector.queries.fleet import engine_starts
from collector.queries.miss_causes import lookup_causes, request_block_causes
from collector.store.lookup_causes import WHOLE_LOOKUP_CAUSES
from collector.store.run_file import RunFile
from engine_hooks.events import Arrive
from tests.support import app
from tests.support.engine import replay_to_collector
from tests.support.hostile import CappedCollector, Sender, frames, header
from visualizer import request_blocks

ADDRESS_SPACE = 8 << 30  # as tests/test_hostile_messages.py caps a collector


def records_by_engine(run: Path) -> dict[str, list[int]]:
    """Each engine's record numbers (drops left out; pool records in `pool`), in order."""
    with RunFile.open(run) as run_file:
        rows = run_file.rows(
            "SELECT engine_id, list(DISTINCT seq ORDER BY seq) FROM ("
            " SELECT engine_id, seq FROM events WHERE kind <> 'drop'"
            " UNION ALL SELECT engine_id, seq FROM pool) GROUP BY engine_id ORDER BY engine_id"
        )
    return {str(engine): list(seqs) for engine, seqs in rows}


def test_an_engine_started_again_under_its_id_is_the_runs_next_engine(tmp_path: Path) -> None:
    """vLLM's real manager with the hooks, twice under one engine id, each start with its
    own transport (as two processes of vLLM send): every record of both is stored."""
    run, endpoint = tmp_path / "run.duckdb", f"ipc://{tmp_path}/collect.ipc"
    collector = CappedCollector(run, endpoint, ADDRESS_SPACE)
    first_hooks, first = replay_to_collector(endpoint, 40, engine_id="prod-a")
    first.stop()
    again_hooks, again = replay_to_collector(endpoint, 30, engine_id="prod-a")
    again.stop()
    exited = collector.stop()
    assert exited.returncode == 0, exited.output
    assert exited.rejected() == {}, exited.output
    stored = records_by_engine(run)
    assert stored == {
        "prod-a": list(range(first_hooks.num_records)),
        "prod-a #2": list(range(again_hooks.num_records)),
    }
    with RunFile.open(run) as run_file:
        starts = engine_starts(run_file)
        missing = run_file.row("SELECT count(*) FROM events WHERE kind = 'drop'")
    assert starts["engine_id"].tolist() == ["prod-a", "prod-a #2"]  # two starts, in order
    assert missing == (0,)


def test_a_stopped_engines_cache_is_gone_for_the_start_after_it(tmp_path: Path) -> None:
    """The first start stops (its closing batch says when, on its records' clock), the second
    starts later with the same prompts: what it misses that the first held is
    `engine_stopped`, on the first, never `other_engine`; without the stop kept, the same
    lookups read as cached on the first (what a killed engine, which sends no stop, gives)."""
    run, endpoint = tmp_path / "run.duckdb", f"ipc://{tmp_path}/collect.ipc"
    collector = CappedCollector(run, endpoint, ADDRESS_SPACE)
    first_hooks, first = replay_to_collector(endpoint, 40, engine_id="prod-a", start_ns=0)
    first.stop()
    again_at = 10**15  # days after the first start's records (its trace's first minutes)
    _, again = replay_to_collector(endpoint, 30, engine_id="prod-a", start_ns=again_at)
    again.stop()
    exited = collector.stop()
    assert exited.returncode == 0, exited.output
    assert exited.rejected() == {}, exited.output
    query = (
        "SELECT cause, sum(tokens)::BIGINT, list(DISTINCT evicted_on) FILTER (evicted_on"
        " IS NOT NULL) FROM lookup_causes WHERE engine = 'prod-a #2' GROUP BY cause"
    )
    with RunFile.open(run) as run_file:
        stops = run_file.rows("SELECT key, value FROM meta WHERE key LIKE 'engine_stopped %'")
        last_ts = run_file.row("SELECT max(ts_ns) FROM events WHERE engine_id = 'prod-a'")
        causes = {cause: (tokens, on) for cause, tokens, on in run_file.rows(query)}
        lines = {line.name: line for line in scorecard(run_file)}
        # A request of the sample sent to both starts under one request id: its lookups have
        # the same record number, each on its own engine; the Requests page tells them apart
        # (before, it drew them as one lookup of twice the prompt).
        looked_up, blocks = request_blocks.numbered(
            lookup_causes(run_file, "rag-39"), request_block_causes(run_file, "rag-39")
        )
        segments = request_blocks.segments(looked_up, blocks, 16, {})
        names = request_blocks.lookup_names(looked_up)
        original_seqs = run_file.rows(
            "SELECT engine, seq FROM lookup_causes WHERE request_id = 'rag-39' GROUP BY ALL"
        )
    assert [key for key, _ in stops] == [
        "engine_stopped prod-a dp0",
        "engine_stopped prod-a #2 dp0",
    ]
    assert json.loads(stops[0][1]) == {
        "engine_id": "prod-a",
        "dp_rank": 0,
        "seq": first_hooks.num_records,
        "stopped_ns": last_ts[0],  # the trace's clock stood still after the last record
    }
    assert causes["engine_stopped"][0] > 0 and causes["engine_stopped"][1] == ["prod-a"]
    assert "other_engine" not in causes
    # No setting of the cache removes a restart's misses: the scorecard does not judge them.
    assert lines["Biggest miss cause"].sentence.endswith("; nothing avoidable was lost.")
    assert sorted(original_seqs) == [("prod-a", 3), ("prod-a #2", 3)]
    assert names == {0: "first admission on prod-a", 1: "first admission on prod-a #2"}
    for number, own in segments.groupby("seq"):  # each lookup's prompt tiled once
        ordered = own.sort_values("start")
        assert list(ordered["start"]) == [0, *ordered["tokens"].cumsum()[:-1]]
        assert ordered["tokens"].sum() == looked_up.loc[looked_up["seq"] == number, "tokens"].sum()
    assert "engine_stopped" in set(segments.loc[segments["seq"] == 1, "cause"])
    # Two starts of one engine never served side by side: no fleet to weigh them as.
    fleet = lines["Fleet balance and routing"]
    assert (fleet.status, fleet.sentence) == (
        "grey",
        "One engine (started 2 times: prod-a, prod-a #2): no fleet to balance or route.",
    )
    overview = app.start(run)
    caption = overview.caption[0].value  # Markdown: its parentheses escaped
    assert "block size 16, 1 engine \\(2 starts\\) of 2,000 blocks each" in caption

    forgotten = tmp_path / "forgotten.duckdb"  # the same run, its stops not kept
    shutil.copy(run, forgotten)
    with duckdb.connect(str(forgotten)) as connection:
        connection.execute("DELETE FROM meta WHERE key LIKE 'engine_stopped %'")
        connection.execute(WHOLE_LOOKUP_CAUSES)
    with RunFile.open(forgotten) as run_file:
        without = {cause: (tokens, on) for cause, tokens, on in run_file.rows(query)}
    assert "engine_stopped" not in without
    assert without["other_engine"][0] == causes["engine_stopped"][0]


def batch(engine_id: str, started_ns: int, first: int, batch_seq: int) -> list[bytes]:
    records = [Arrive(seq, seq + 1, f"r{seq}", 16) for seq in range(first, first + 3)]
    return frames(header(engine_id, records, batch_seq=batch_seq, started_ns=started_ns), records)


def test_a_killed_collector_names_each_start_as_before(tmp_path: Path) -> None:
    run, endpoint = tmp_path / "run.duckdb", f"ipc://{tmp_path}/collect.ipc"
    collector = CappedCollector(run, endpoint, ADDRESS_SPACE)
    old, new = Sender(endpoint), Sender(endpoint)
    old.send(batch("e", 111, 0, 0))
    old.wait_for_ack(0)
    new.send(batch("e", 222, 0, 0))  # started again: its records from 0
    new.wait_for_ack(0)
    new.send(batch("e", 222, 3, 1))
    new.wait_for_ack(1)
    collector.process.send_signal(signal.SIGKILL)
    collector.process.wait()

    restarted = CappedCollector(run, endpoint, ADDRESS_SPACE)
    old.send(batch("e", 111, 3, 1))  # each start goes on from its own record numbers
    old.wait_for_ack(1)
    new.send(batch("e", 222, 0, 0))  # that start's first batch again: refused as replayed
    new.send(batch("e", 222, 6, 2))
    new.wait_for_ack(2)
    new.send(batch("e", 333, 0, 0))  # a third start
    new.wait_for_ack(0)
    for sender in (old, new):
        sender.close()
    exited = restarted.stop()
    assert exited.returncode == 0, exited.output
    assert exited.rejected() == {"replayed": 1}, exited.output
    assert records_by_engine(run) == {
        "e": list(range(6)),
        "e #2": list(range(9)),
        "e #3": list(range(3)),
    }


def test_starts_are_bounded_by_the_collectors_engines(tmp_path: Path) -> None:
    """A sender claiming a new start in every batch makes no more engines than
    `--limit engines` allows; the rest is refused, by that reason."""
    run, endpoint = tmp_path / "run.duckdb", f"ipc://{tmp_path}/collect.ipc"
    collector = CappedCollector(run, endpoint, ADDRESS_SPACE, "--limit", "engines=4")
    sender = Sender(endpoint)
    for started_ns in range(1, 11):
        sender.send(batch("e", started_ns, 0, started_ns))
    sender.send(batch("e", 1, 3, 11))
    sender.wait_for_ack(11)
    sender.close()
    exited = collector.stop()
    assert exited.returncode == 0, exited.output
    assert exited.rejected() == {"engines": 6}, exited.output
    assert sorted(records_by_engine(run)) == ["e", "e #2", "e #3", "e #4"]
    assert records_by_engine(run)["e"] == list(range(6))
