"""A segmented run (collector/store/segments.py, segmented_run.py; docs/run-files.md):
closed segment after closed segment, it reads as the same run in one file (its summary, the
eviction ages, the lifetimes, its live copy, its Parquet export), ClickHouse reads its
closed segments where they lie, a real `kvscope collect` writes one from a real replay, and
retention drops the oldest segments, saying so."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import duckdb
import pytest

from collector.queries.summary import run_summary
from collector.queries.timeline import run_calendar, time_grid
from collector.replay.block_manager import CacheSettings
from collector.store import live_copy
from collector.store.live_copy import LiveCopy
from collector.store.parquet_dataset import DERIVED_TABLES
from collector.store.parquet_export import export_parquet
from collector.store.run_file import RunConfig, RunFile, RunStore, live_copy_path, open_readable
from collector.store.segment_lifetimes import DERIVED_FILES
from collector.store.segmented_run import ORIGIN_KEY, RETENTION_KEY
from collector.store.segments import SegmentPolicy, Segments
from engine_hooks import Event
from tests.support.app import start
from tests.support.block_manager import sample_engine_steps
from tests.support.engine import (
    collector_process,
    replay_to_collector,
    stop_collector,
    wait_for,
)
from tests.support.repo import REPO

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version

SETTINGS = CacheSettings(block_size=16, num_blocks=120)  # small: blocks are evicted and reused
# What the run's tables derived from its rows hold, to compare a segmented run with one file.
FIGURES = (
    "SELECT count(*), sum(age_ns), sum(num_hits) FROM events",
    "SELECT count(*), sum(hits), count(DISTINCT ended_by) FROM cache_lifetimes",
    "SELECT count(*), sum(num_hit_tokens), sum(num_prompt_tokens) FROM requests",
    "SELECT count(*), sum(tokens) FROM lookup_causes",
    "SELECT count(*), sum(num_free), sum(num_cached_free) FROM pool",
)


def config(run_id: str) -> RunConfig:
    return RunConfig("test", SETTINGS.block_size, SETTINGS.num_blocks, "sha256", "t", run_id=run_id)


def two_engines(num_requests: int) -> list[list[Event]]:
    engine_a = sample_engine_steps(SETTINGS, num_requests, "a")
    engine_b = sample_engine_steps(SETTINGS, num_requests, "b")
    return [step for pair in itertools.zip_longest(engine_a, engine_b) for step in pair if step]


# The derived tables compared row for row with one run file's: those without averages.
WHOLE_ROWS = ("cache_lifetimes", "lookup_causes", "prefix_blocks", "requests", "tenant_sharing")


def figures(run: RunFile) -> list[object]:
    return [run_summary(run), *(run.row(sql) for sql in FIGURES)]


def derived_rows(run: RunFile, tables: tuple[str, ...] = tuple(sorted(DERIVED_TABLES))) -> dict:
    """Every row of the run's derived `tables`, in one order."""
    return {table: sorted(run.rows(f"SELECT * FROM {table}"), key=repr) for table in tables}


def derived_listed(directory: Path) -> int:
    """The closed segments whose manifests list their derived files (all three)."""
    return sum(
        {entry["table"] for entry in json.loads(path.read_text())["files"].values()}
        >= set(DERIVED_FILES)
        for path in (directory / "manifests").glob("*.json")
    )


def strip_derived(directory: Path) -> None:
    """The closed segments as a kvscope before derived files closed them: none listed."""
    for path in (directory / "manifests").glob("*.json"):
        manifest = json.loads(path.read_text())
        for name, entry in list(manifest["files"].items()):
            if entry["table"] in DERIVED_FILES:
                (directory / name).unlink()
                del manifest["files"][name]
        path.write_text(json.dumps(manifest))


def across_boundaries(directory: Path) -> tuple[int, int, int]:
    """What the closed segments carried across a boundary: lifetimes ended in a segment
    after their store's, hits on a store of an earlier segment, and requests whose records
    lie in more than one segment."""

    def count(sql: str) -> int:
        row = duckdb.connect().execute(sql).fetchone()
        return int(row[0]) if row else 0

    number = "CAST(regexp_extract(filename, '-(\\d+)(_\\d+)?\\.parquet$', 1) AS INTEGER)"
    files = "read_parquet('{}/{}/**/*.parquet', filename = true, hive_partitioning = false)"
    ended = count(
        f"SELECT count(*) FROM {files.format(directory, 'cache_lifetimes')} "
        f"WHERE stored_segment < {number}"
    )
    hits = count(
        f"SELECT count(*) FROM {files.format(directory, 'hit_stores')} "
        f"WHERE cached AND stored_segment < {number}"
    )
    requests = count(
        f"SELECT count(*) FROM (SELECT request_id FROM {files.format(directory, 'events')} "
        f"WHERE request_id IS NOT NULL GROUP BY request_id HAVING count(DISTINCT {number}) > 1)"
    )
    return ended, hits, requests


@pytest.fixture(autouse=True)
def copy_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live_copy, "PUBLISH_ALWAYS_S", float("inf"))


def test_a_segmented_run_reads_as_the_same_run_in_one_file(tmp_path: Path) -> None:
    plain = RunStore.create(tmp_path / "plain.duckdb", config("plain"))
    head = RunStore.create(tmp_path / "run.duckdb", config("segmented"))
    live = LiveCopy(head, threads=1, memory_limit="1GB")
    lines: list[str] = []
    segments = Segments(head, SegmentPolicy(rows=400), live, log=lines.append)
    for number, records in enumerate(two_engines(60)):
        plain.append(records)
        head.append(records)
        if number % 5 == 0:
            head.flush()
            segments.close_if_due()
        if number == 200:  # the live copy holds the open segment: read, it is the run so far
            assert live.publish()
            live.wait()
            plain.refresh_derived()  # flushed, the eviction ages filled
            with RunFile.open_live_copy(live.path) as copy:
                assert copy.row(FIGURES[0]) == plain.row(FIGURES[0])
    assert segments.next > 10 and len(lines) == segments.next, "closed, and each said so"
    live.close()
    for store in (plain, head):
        store.finalize()
        store.close()
    assert derived_listed(segments.directory) == segments.next
    assert min(across_boundaries(segments.directory)) > 0, "carried across boundaries"
    with RunFile.open(plain.path) as one, RunFile.open(head.path) as segmented:
        expected = figures(one)
        assert figures(segmented) == expected
        assert derived_rows(segmented, WHOLE_ROWS) == derived_rows(one, WHOLE_ROWS)
        derived = derived_rows(segmented)
        export_parquet(segmented, tmp_path / "dataset")
    with RunFile.open(tmp_path / "dataset") as exported:
        assert figures(exported) == expected
    strip_derived(segments.directory)  # as a kvscope before them closed its segments
    assert derived_listed(segments.directory) == 0
    with RunFile.open(head.path) as older:
        assert figures(older) == expected
        assert derived_rows(older) == derived


def test_clickhouse_reads_the_closed_segments_where_they_lie(tmp_path: Path) -> None:
    head = RunStore.create(tmp_path / "run.duckdb", config("segmented"))
    segments = Segments(head, SegmentPolicy(rows=1_000), log=lambda _: None)
    for records in two_engines(20):
        head.append(records)
        head.flush()
        segments.close_if_due()
    listed = [
        entry["rows"]
        for manifest in (segments.directory / "manifests").glob("*.json")
        for name, entry in json.loads(manifest.read_text())["files"].items()
        if name.startswith("events/")
    ]
    head.finalize()
    head.close()
    import chdb  # noqa: PLC0415 - chdb (embedded ClickHouse) is a dev extra, slow to load

    text = str(
        chdb.query(
            f"SELECT engine, count() FROM file('{segments.directory}/events/**/*.parquet', "
            "Parquet) GROUP BY engine ORDER BY engine SETTINGS use_hive_partitioning = 1",
            "CSV",
        )
    )
    counted = [line.replace('"', "").split(",") for line in text.strip().splitlines()]
    assert [engine for engine, _ in counted] == ["a", "b"]
    assert sum(int(count) for _, count in counted) == sum(listed) > 0


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """The same replay (three engines one after the other, each acknowledged before the
    next) sent to three real `kvscope collect` processes: one run file, a segmented run, and
    a segmented run keeping no segment closed before the latest; each run with its output."""
    directory = tmp_path_factory.mktemp("collected")
    options = {
        "plain": (),
        "segmented": ("--segment-rows", "300"),
        "kept": ("--segment-rows", "300", "--keep", "0"),
    }
    runs: dict[str, tuple[Path, str]] = {}
    for name, extra in options.items():
        run, endpoint = directory / f"{name}.duckdb", f"ipc://{directory}/{name}"
        with collector_process(run, endpoint, *extra) as process:
            for engine in ("e1", "e2", "e3"):
                _, transport = replay_to_collector(endpoint, 25, engine_id=engine)
                transport.stop()
            runs[name] = (run, stop_collector(process))
    return runs


def test_a_real_collector_writes_a_segmented_run_read_as_the_same_run(
    collected: dict[str, tuple[Path, str]],
) -> None:
    (plain, _), (segmented, output) = collected["plain"], collected["segmented"]
    closed = [line for line in output.splitlines() if "segment " in line and " closed" in line]
    assert len(closed) >= 2, output
    assert derived_listed(segmented.with_name(segmented.name + ".segments")) >= 2
    with RunFile.open(plain) as one, RunFile.open(segmented) as whole:
        assert figures(whole) == figures(one)
        assert derived_rows(whole, WHOLE_ROWS) == derived_rows(one, WHOLE_ROWS)
        assert whole.row("SELECT count(DISTINCT engine_id) FROM events") == (3,)


def test_retention_drops_the_oldest_segments_and_says_so(
    collected: dict[str, tuple[Path, str]],
) -> None:
    (plain, _), (kept, output) = collected["plain"], collected["kept"]
    assert "kvscope collect: retention: segments 0 to" in output, output
    head = RunStore.open_copy(kept)  # the head alone: its settings and the open segment
    meta = dict(head.rows("SELECT key, value FROM meta"))
    head_events = head.row("SELECT count(*) FROM events")
    head.close()
    assert "dropped" in meta[RETENTION_KEY] and "--keep 0 days" in meta[RETENTION_KEY]
    first, next_ = int(meta["segments_first"]), int(meta["segments_next"])
    assert first == next_ - 1 > 0, "only the latest closed segment is kept"
    manifests = sorted((Path(meta["segments_dir"]) / "manifests").glob("*.json"))
    assert [path.stem.rsplit("-", 1)[1] for path in manifests] == [f"{first:06d}"]
    kept_rows = sum(
        entry["rows"]
        for name, entry in json.loads(manifests[0].read_text())["files"].items()
        if name.startswith("events/")
    )
    with RunFile.open(plain) as one, RunFile.open(kept) as retained:
        everything = one.row("SELECT count(*) FROM events")
        assert retained.row("SELECT count(*) FROM events") == (kept_rows + head_events[0],)
        assert everything is not None and kept_rows + head_events[0] < everything[0]
        rows = retained.rows("SELECT engine_id, seq, kind, block_id FROM events")
        assert set(rows) <= set(one.rows("SELECT engine_id, seq, kind, block_id FROM events"))
        assert run_summary(retained)["requests"] < run_summary(one)["requests"]
        # The run's first record, dropped, is remembered: the first kept record's wall time
        # is the run's start plus the time between them, as in the one run file.
        whole_start, kept_start = time_grid(one).start_ns, time_grid(retained).start_ns
        started = retained.row("SELECT started_at FROM runs")
        assert started is not None
        shift = timedelta(seconds=(kept_start - whole_start) / 1e9)
        assert run_calendar(retained).started_at == started[0] + shift
    assert int(meta[ORIGIN_KEY]) == whole_start


def test_bad_segment_options_are_refused_in_one_line(tmp_path: Path) -> None:
    for options in (
        ["--keep", "3"],
        ["--keep-size", "3GB"],
        ["--segment-dir", str(tmp_path)],
        ["--segment-rows", "0"],
        ["--segment-rows", "10", "--keep-size", "lots"],
    ):
        result = subprocess.run(
            [sys.executable, "-m", "collector.cli", "collect", "--db", "r.duckdb", *options],
            cwd=tmp_path,
            env={"PYTHONPATH": str(REPO), "PATH": ""},
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert not (tmp_path / "r.duckdb").exists()


def test_a_segmented_run_killed_and_restarted_loses_nothing_and_its_view_goes_on(
    tmp_path: Path, collected: dict[str, tuple[Path, str]]
) -> None:
    """The replay the `collected` collectors took, to a segmented collector killed
    (SIGKILL) after two engines' records were acknowledged, and restarted on its run for the
    third: the run is the plain one, and a segment the killed collector had half closed (its
    files there, its head not told) is written again, not left beside."""
    run, endpoint = tmp_path / "run.duckdb", f"ipc://{tmp_path}/hooks"
    segments = tmp_path / "run.duckdb.segments"
    with collector_process(run, endpoint, "--segment-rows", "300") as process:
        for engine in ("e1", "e2"):
            _, transport = replay_to_collector(endpoint, 25, engine_id=engine)
            transport.stop()
        wait_for(lambda: len(list((segments / "manifests").glob("*.json"))) >= 2)
        wait_for(lambda: live_copy_path(run).exists())
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    head = RunStore.open_copy(run)
    next_segment = int(dict(head.rows("SELECT key, value FROM meta"))["segments_next"])
    head.close()
    assert next_segment >= 1, "killed in the middle of a segmented run"
    stem = f"{run_id(run)}-{next_segment:06d}"
    half_closed = segments / "events" / "engine=ghost" / "date=2026-01-01" / f"{stem}_0.parquet"
    half_closed.parent.mkdir(parents=True)
    half_closed.write_bytes(b"what a killed collector left")
    with collector_process(run, endpoint, "--segment-rows", "300") as process:
        _, transport = replay_to_collector(endpoint, 25, engine_id="e3")
        transport.stop()
        wait_for(lambda: engines_in_view(run) == 3)  # the live view goes on
        output = stop_collector(process)
    assert not half_closed.exists(), output
    (plain, _) = collected["plain"]
    with RunFile.open(plain) as one, RunFile.open(run) as restarted:
        assert run_summary(restarted) == run_summary(one)
        for sql in (*FIGURES[1:], "SELECT count(*), count(age_ns) FROM events"):
            assert restarted.row(sql) == one.row(sql), sql
        rows = "SELECT engine_id, seq, kind, block_id FROM events ORDER BY ALL"
        assert restarted.rows(rows) == one.rows(rows)
        assert derived_rows(restarted, WHOLE_ROWS) == derived_rows(one, WHOLE_ROWS)


def run_id(run: Path) -> str:
    head = RunStore.open_copy(run)
    row = head.row("SELECT run_id FROM runs")
    head.close()
    assert row is not None
    return str(row[0])


def engines_in_view(run: Path) -> int:
    """The engines the run's readers see, while it is written (its live copy) or after."""
    view, _ = open_readable(run)
    with view:
        row = view.row("SELECT count(DISTINCT engine_id) FROM events")
    return int(row[0]) if row else 0


def test_the_app_shows_a_segmented_run_as_the_run_in_one_file(
    collected: dict[str, tuple[Path, str]],
) -> None:
    (plain, _), (segmented, _) = collected["plain"], collected["segmented"]

    def overview(run: Path) -> list[tuple[str, str]]:
        app = start(run)
        assert not app.error, [error.value for error in app.error]
        return [(metric.label, metric.value) for metric in app.metric]

    shown = overview(segmented)
    assert ("Requests", "75") in shown
    assert shown == overview(plain)


def test_an_engine_restarted_under_its_id_ends_the_derived_segments(tmp_path: Path) -> None:
    """An engine that starts again under the same engine id numbers its records from 0: the
    segments from then on cannot go on from the lifetimes of the ones before, so they are
    closed without derived files, and the run reads as derived from all its rows."""
    plain = RunStore.create(tmp_path / "plain.duckdb", config("plain"))
    head = RunStore.create(tmp_path / "run.duckdb", config("restarted"))
    segments = Segments(head, SegmentPolicy(rows=400), log=lambda _: None)
    steps = [*sample_engine_steps(SETTINGS, 30, "a"), *sample_engine_steps(SETTINGS, 30, "a")]
    for number, records in enumerate(steps):
        plain.append(records)
        head.append(records)
        if number % 5 == 0:
            head.flush()
            segments.close_if_due()
    for store in (plain, head):
        store.finalize()
        store.close()
    assert 0 < derived_listed(segments.directory) < segments.next
    with RunFile.open(plain.path) as one, RunFile.open(head.path) as segmented:
        assert derived_rows(segmented, WHOLE_ROWS) == derived_rows(one, WHOLE_ROWS)


def test_retention_by_size_keeps_the_newest_segments_within_it(tmp_path: Path) -> None:
    head = RunStore.create(tmp_path / "run.duckdb", config("sized"))
    lines: list[str] = []
    segments = Segments(head, SegmentPolicy(rows=1_000), log=lines.append)
    for records in two_engines(20):
        head.append(records)
        head.flush()
        segments.close_if_due()
    manifests = [
        json.loads(path.read_text()) for path in sorted(segments.directory.glob("manifests/*"))
    ]
    assert len(manifests) == segments.next > 3
    sizes = [sum(entry["bytes"] for entry in m["files"].values()) for m in manifests]
    segments.drop_beyond(sizes[-1] + sizes[-2])  # room for the newest two
    assert (segments.first, segments.next) == (len(manifests) - 2, len(manifests))
    assert f"retention: segments 0 to {len(manifests) - 3} dropped" in lines[-1]
    assert "(--keep-size)" in lines[-1]
    kept = sum(
        entry["rows"]
        for m in manifests[-2:]
        for name, entry in m["files"].items()
        if name.startswith("events/")
    )
    open_rows = head.row("SELECT count(*) FROM events")
    head.finalize()
    head.close()
    assert len(list(segments.directory.glob("manifests/*"))) == 2
    assert len(list(segments.directory.glob("events/**/*.parquet"))) == 2 * 2  # two engines
    for name in DERIVED_FILES:  # dropped with their segments
        assert len(list(segments.directory.glob(f"{name}/*.parquet"))) == 2
    kept_files = f"read_parquet('{segments.directory}/cache_lifetimes/*.parquet')"
    from_dropped = (
        duckdb.connect()
        .execute(f"SELECT count(*) FROM {kept_files} WHERE stored_segment < {segments.first}")
        .fetchone()
    )
    assert from_dropped is not None and from_dropped[0] > 0, "stores in dropped segments"
    with RunFile.open(head.path) as run:
        assert open_rows is not None
        assert run.row("SELECT count(*) FROM events") == (kept + open_rows[0],)
        row = run.row("SELECT value FROM meta WHERE key = ?", [RETENTION_KEY])
        assert row is not None and "(--keep-size)" in row[0]
        derived = derived_rows(run)
    strip_derived(segments.directory)  # derived from the kept rows alone, as before
    with RunFile.open(head.path) as run:
        assert derived_rows(run) == derived


@pytest.mark.parametrize("older", [False, True], ids=["derived", "older segments"])
def test_a_head_resumed_after_a_kill_ages_its_evictions_from_the_closed_segments(
    tmp_path: Path, older: bool
) -> None:
    """A segmented run whose writer stopped without finishing (as SIGKILL leaves it: rows
    committed, some evictions not yet aged) and was resumed: the evictions whose store is
    in a closed segment get their ages, and the run equals one written in one go. `older`:
    its closed segments written by a kvscope before derived files, so the resumed
    collector's segments have none either (they would go on from them)."""
    steps = two_engines(60)
    plain = RunStore.create(tmp_path / "plain.duckdb", config("plain"))
    for records in steps:
        plain.append(records)
    plain.finalize()
    plain.close()
    head = RunStore.create(tmp_path / "run.duckdb", config("killed"))
    segments = Segments(head, SegmentPolicy(rows=400), log=lambda _: None)
    half = len(steps) // 2
    for number, records in enumerate(steps[:half]):
        head.append(records)
        if number % 5 == 0:
            head.flush()
            segments.close_if_due()
    head.flush()  # committed, and not folded: no ages yet for the open segment's evictions
    unaged = head.row("SELECT count(*) FROM events WHERE kind = 'evict' AND age_ns IS NULL")
    assert unaged is not None and unaged[0] > 0 and segments.next > 3
    head.close()
    if older:
        strip_derived(segments.directory)
    head = RunStore.resume(head.path)
    segments = Segments(head, SegmentPolicy(rows=400), log=lambda _: None)
    for number, records in enumerate(steps[half:]):
        head.append(records)
        if number % 5 == 0:
            head.flush()
            segments.close_if_due()
    head.finalize()
    head.close()
    assert derived_listed(segments.directory) == (0 if older else segments.next)
    with RunFile.open(plain.path) as one, RunFile.open(head.path) as resumed:
        assert figures(resumed) == figures(one)
        assert derived_rows(resumed, WHOLE_ROWS) == derived_rows(one, WHOLE_ROWS)
