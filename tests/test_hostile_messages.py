"""`kvscope collect` bounds what well-formed messages claim by its own limits, not the
sender's: a real collector process, its address space capped, takes hostile values at and
past every bound from a plain pyzmq socket (as any local user could send them), stays up and
small, stores every valid record once, and counts each refusal by reason."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from collector.live.exporter import KvscopeMetrics
from collector.live.limits import Limits
from collector.live.live_state import OTHER, LiveState
from collector.store.run_file import RunFile
from engine_hooks.events import (
    INT32_MAX,
    INT64_MAX,
    Allocate,
    Arrive,
    Free,
    Lookup,
    Pool,
    Store,
    pack_counts,
)
from tests.support.engine import replay_to_collector
from tests.support.hostile import CappedCollector, Sender, frames, header
from tests.support.hostile_stream import LIMITS, HostileStream, limit_args
from tests.support.ports import free_port
from tests.support.repo import REPO

GB = 1 << 30
# The collector's address space, not its resident memory: Python, DuckDB, pyarrow and their
# threads reserve about 2.3 GB of it idle. A collector that tried to hold 2^31 blocks (21 GB)
# fails inside it, not in the host's other processes.
ADDRESS_SPACE = 8 * GB


def stored(run: Path) -> tuple[int, int]:
    """(distinct engine record numbers, engines) a run file holds."""
    with RunFile.open(run) as run_file:
        row = run_file.row(
            "SELECT count(DISTINCT (engine_id, dp_rank, seq)), count(DISTINCT engine_id) FROM ("
            " SELECT engine_id, dp_rank, seq FROM events WHERE kind <> 'drop'"
            " UNION ALL SELECT engine_id, dp_rank, seq FROM pool)"
        )
    assert row is not None
    return int(row[0]), int(row[1])


def test_a_115_byte_pool_claim_is_refused_and_the_collector_stays_small(tmp_path: Path) -> None:
    """A header claiming a pool of 2^31 - 1 blocks, with one block near its end, made the
    collector's cache mirror 21.3 GB; now it is refused, and a real engine's records that
    come after it are stored, all within 1 GB."""
    run, endpoint = tmp_path / "run.duckdb", f"ipc://{tmp_path}/collect.ipc"
    records = [Allocate(0, 1, "r", pack_counts([INT32_MAX - 1]))]
    bomb = frames(header("x", records, num_blocks=INT32_MAX), records)
    assert sum(map(len, bomb)) <= 115
    collector = CappedCollector(run, endpoint, ADDRESS_SPACE)
    sender = Sender(endpoint)
    sender.send(bomb)
    hooks, transport = replay_to_collector(endpoint, 60, engine_id="real")
    transport.stop()
    sender.close()
    exited = collector.stop()
    assert exited.returncode == 0, exited.output
    assert "Traceback" not in exited.output
    assert exited.rejected() == {"pool-blocks": 1}, exited.output
    assert exited.peak_rss_bytes < GB
    assert stored(run) == (hooks.num_records, 1)


def test_a_replayed_or_overtaken_batch_is_stored_once(tmp_path: Path) -> None:
    """Batches sent twice, one overtaken by the next (its records already counted missing),
    and record numbers of 2^63 - 1: the run holds each record once, derives no eviction from
    a replay, and counts only the records that really are missing."""
    run, endpoint = tmp_path / "run.duckdb", f"ipc://{tmp_path}/collect.ipc"
    hashes = b"\x01" * 8 + b"\x02" * 8

    def batch(first: int, batch_seq: int, **changes: object) -> list[bytes]:
        blocks = [first, first + 1]  # cached and free after it: allocated again, evicted
        records = [
            Arrive(first, 1, f"r{first}", 32),
            Lookup(first + 1, 2, f"r{first}", 32, 0, 0, False),
            Allocate(first + 2, 3, f"r{first}", pack_counts(blocks)),
            Store(first + 3, 4, f"r{first}", pack_counts(blocks), hashes, None, 0, 16),
            Free(first + 4, 5, f"r{first}", pack_counts(blocks)),
        ]
        return frames(header("e", records, batch_seq=batch_seq, **changes), records)

    collector = CappedCollector(run, endpoint, ADDRESS_SPACE)
    sender = Sender(endpoint)
    first, second, third, fourth = batch(0, 0), batch(5, 1), batch(10, 2), batch(15, 3)
    for message in (first, first, second, first, second, fourth, third):
        sender.send(message)
    huge = [Pool(INT64_MAX, 6, None, 1, None, 1)]
    sender.send(frames(header("e", huge, batch_seq=4), huge))
    sender.send(frames(header("e", [], batch_seq=5, next_seq=INT64_MAX), []))
    sender.send(batch(20, 6, num_lost_in_engine=INT64_MAX))
    last = batch(20, 7)
    sender.send(last)
    sender.wait_for_ack(7)
    sender.close()
    exited = collector.stop()
    assert exited.returncode == 0, exited.output
    assert exited.rejected() == {"replayed": 4, "seq-jump": 3}, exited.output
    with RunFile.open(run) as run_file:
        kinds = dict(run_file.rows("SELECT kind::VARCHAR, count(*) FROM events GROUP BY ALL"))
        seqs = run_file.rows("SELECT DISTINCT seq FROM events WHERE kind <> 'drop' ORDER BY 1")
        drops = run_file.rows("SELECT seq, num_lost FROM events WHERE kind = 'drop'")
    # Batches 0, 5, 15 and 20 once each, no block evicted (a replayed allocation would
    # evict what its first sending stored); 15 came before 10: 10's records are a gap.
    assert kinds == {"arrive": 4, "lookup": 4, "allocate": 8, "store": 8, "free": 8, "drop": 1}
    assert [seq for (seq,) in seqs] == [*range(10), *range(15, 25)]
    assert drops == [(10, 5)]


def test_forty_thousand_engines_take_the_run_s_limit_and_no_more(tmp_path: Path) -> None:
    """Each of 40,000 made-up engine and DP-rank pairs sends a batch touching the last block
    of a 65,536-block pool (993 MB of collector before the limits): the first 256 fill the
    run's engines and its 16,777,216 pool blocks, the rest are refused; the collector stays
    within 1 GB, its cache mirrors at most 302 MB of it."""
    run, endpoint = tmp_path / "run.duckdb", f"ipc://{tmp_path}/collect.ipc"
    limits = Limits()
    pool = limits.total_pool_blocks // limits.engines
    collector = CappedCollector(run, endpoint, ADDRESS_SPACE)
    sender = Sender(endpoint)
    num_engines = 40_000
    for index in range(num_engines):
        records = [Allocate(0, 1, "r", pack_counts([pool - 1])), Pool(1, 2, None, 0, None, 1)]
        engine = (f"fake-{index // 1000}", index % 1000)
        sender.send(
            frames(
                header(engine[0], records, dp_rank=engine[1], batch_seq=index, num_blocks=pool),
                records,
            )
        )
    closing = [Pool(2, 3, None, 0, None, 1)]
    sender.send(frames(header("fake-0", closing, batch_seq=num_engines, num_blocks=pool), closing))
    sender.wait_for_ack(num_engines)
    sender.close()
    exited = collector.stop()
    assert exited.returncode == 0, exited.output
    assert exited.rejected() == {"engines": num_engines - limits.engines}, exited.output
    assert stored(run) == (2 * limits.engines + 1, 1)
    assert exited.peak_rss_bytes < GB


def test_tenants_past_the_limit_are_one_label_and_requests_are_forgotten_oldest_first() -> None:
    """140,000 requests of as many tenants and adapters, none finishing: the exporter's
    labels stop at the limits (the rest counted under "other", no count lost), and the live
    state holds at most `requests` requests' tenants (65,536: at most 27 MB with request ids
    of 256 characters).
    (benchmarks/hostile_messages.py measures 1,000,000 tenants through a real collector.)"""
    limits = Limits()
    state = LiveState(limits)
    tracemalloc.start()
    for start in range(0, 140_000, 10_000):
        records: list[Arrive | Lookup] = []
        for index in range(start, start + 10_000):
            request, name = f"request-{index:06d}", f"name-{index:06d}-" + "x" * 240
            records.append(Arrive(2 * index, 1, request, 64, tenant=name))
            records.append(Lookup(2 * index + 1, 1, request, 64, 16, 1, False, lora=name))
        state.observe(header("e", records), records)
    held = tracemalloc.get_traced_memory()[0]  # the state, and the last 10,000 requests' records
    tracemalloc.stop()
    assert held < 32 << 20  # every request's tenant remembered: over 80 MB
    assert sum(state.requests.values()) == 140_000
    assert sum(state.query_tokens.values()) == 64 * 140_000
    tenants = {tenant for tenant, _ in state.requests}
    adapters = {lora for _, lora in state.requests}
    assert len(tenants) == limits.tenants + 1 and OTHER in tenants
    assert len(adapters) == limits.adapters + 1 and OTHER in adapters
    registry = CollectorRegistry()
    registry.register(KvscopeMetrics(state))
    text = generate_latest(registry).decode()
    series = [line for line in text.splitlines() if line.startswith("kvscope_prefix_cache_req")]
    assert len(series) == limits.tenants + 1  # (own, own), (own, other), (other, other)
    assert len(state._tenants) == limits.requests


def test_a_real_collector_labels_at_most_its_limit_of_tenants(tmp_path: Path) -> None:
    """Through a real collector and a real scrape: 20,000 tenants make 4 tenant labels with
    `--limit tenants=3`, and every request is counted."""
    run, endpoint = tmp_path / "run.duckdb", f"ipc://{tmp_path}/collect.ipc"
    port = free_port()
    collector = CappedCollector(
        run, endpoint, ADDRESS_SPACE, "--metrics-port", str(port), "--limit", "tenants=3"
    )
    sender = Sender(endpoint)
    records = [Arrive(2 * i, 1, f"r{i}", 8, tenant=f"t{i}") for i in range(20_000)]
    records += [Lookup(2 * i + 1, 1, f"r{i}", 8, 0, 0, False) for i in range(20_000)]
    records.sort(key=lambda record: record.seq)
    for batch_seq, start in enumerate(range(0, len(records), 5_000)):
        part = records[start : start + 5_000]
        sender.send(frames(header("e", part, batch_seq=batch_seq), part))
    sender.wait_for_ack(batch_seq)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as response:
        text = response.read().decode()
    sender.close()
    exited = collector.stop()
    assert exited.returncode == 0, exited.output
    series = [
        line for line in text.splitlines() if line.startswith("kvscope_prefix_cache_requests")
    ]
    assert sorted(line.split('tenant="')[1].split('"')[0] for line in series) == [
        "other",
        "t0",
        "t1",
        "t2",
    ]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in series) == 20_000


def test_hostile_values_at_and_past_every_bound(tmp_path: Path) -> None:
    """12,000 seeded messages, well-formed, their values at and past every bound (pool
    sizes, block ids, engines and DP ranks, record numbers and their jumps, times, counts,
    label lengths, replays): the collector stays up, stores exactly the valid records, once
    each, with exactly the gaps they leave, and counts every refusal by its reason."""
    run, endpoint = tmp_path / "run.duckdb", f"ipc://{tmp_path}/collect.ipc"
    stream = HostileStream(seed=36)
    collector = CappedCollector(run, endpoint, ADDRESS_SPACE, *limit_args(LIMITS))
    sender = Sender(endpoint)
    num_messages = 12_000
    for _ in range(num_messages):
        sender.send(stream.message())
    sender.send(stream.closing())
    sender.wait_for_ack(stream.batch_seq)
    assert collector.running()
    sender.close()
    exited = collector.stop()
    expected = stream.expected
    assert exited.returncode == 0, exited.output
    assert "Traceback" not in exited.output
    assert exited.rejected() == expected.rejected, exited.output
    assert sum(expected.rejected.values()) > num_messages // 3
    assert len(expected.rejected) == 10  # every reason a well-formed message can have
    with RunFile.open(run) as run_file:
        keys = run_file.rows(
            "SELECT DISTINCT engine_id, dp_rank, seq FROM ("
            " SELECT engine_id, dp_rank, seq FROM events WHERE kind NOT IN ('drop', 'evict')"
            " UNION ALL SELECT engine_id, dp_rank, seq FROM pool"
            " UNION ALL SELECT engine_id, dp_rank, seq FROM collisions)"
        )
        counts = run_file.row(
            "SELECT (SELECT count(*) FROM events WHERE kind NOT IN ('drop', 'evict')),"
            " (SELECT count(*) FROM pool), (SELECT count(*) FROM collisions),"
            " (SELECT count(*) FROM events WHERE kind = 'drop'),"
            " (SELECT coalesce(sum(num_lost), 0) FROM events WHERE kind = 'drop')"
        )
    assert {(str(engine), int(rank), int(seq)) for engine, rank, seq in keys} == expected.keys
    assert counts == (
        expected.event_rows,
        expected.pool_rows,
        expected.collision_rows,
        len(expected.drops),
        sum(expected.drops),
    )


@pytest.mark.parametrize("setting", ["pools=5", "engines=0", "engines=ten", "tenants=-1"])
def test_a_limit_that_is_not_one_is_refused_with_exit_2(tmp_path: Path, setting: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "collector.cli",
            "collect",
            "--db",
            str(tmp_path / "r.duckdb"),
            "--limit",
            setting,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert f"--limit {setting}:" in done.stderr
    assert not (tmp_path / "r.duckdb").exists()
