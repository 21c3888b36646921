"""A run exported as a hive-partitioned Parquet dataset (`kvscope export RUN --parquet DIR`,
collector/store/parquet_dataset.py): DuckDB reads every table back as the run file holds it,
`summary` and the app show the same figures, two engines' runs open as the one run a
collector recording both writes, and what cannot be exported or combined is refused."""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil
from pathlib import Path

import pytest

from collector.cli import main
from collector.queries.summary import run_summary
from collector.replay.block_manager import CacheSettings
from collector.store.parquet_export import export_parquet
from collector.store.run_file import RUN_TABLES, RunConfig, RunFile, RunStore, StoreError
from engine_hooks import Event
from tests.support.app import go_to, metrics, start
from tests.support.block_manager import sample_engine_steps, tiny_run
from tests.support.repo import SAMPLE_RUN
from tests.support.runs import SHARED_PREFIX, shared_prefix_run

EVERY_ROW = "SELECT * FROM {} ORDER BY ALL"
PAGES = ["views/overview.py", "views/hotspots.py", "views/prefix_tree.py", "views/free_blocks.py"]
SETTINGS = CacheSettings(block_size=16, num_blocks=300)
CONFIG = RunConfig("test", SETTINGS.block_size, SETTINGS.num_blocks, "sha256", "test")


@pytest.fixture(scope="module")
def sample_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample run exported through the command line."""
    directory = tmp_path_factory.mktemp("export") / "sample"
    assert main(["export", str(SAMPLE_RUN), "--parquet", str(directory)]) == 0
    return directory


def summary_json(run: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    capsys.readouterr()
    assert main(["summary", str(run), "--json"]) == 0
    return dict(json.loads(capsys.readouterr().out))


def test_summary_of_the_dataset_equals_the_run_files(
    sample_dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert summary_json(sample_dataset, capsys) == summary_json(SAMPLE_RUN, capsys)


def test_duckdb_reads_every_table_back_as_the_run_file_holds_it(sample_dataset: Path) -> None:
    with RunFile.open(SAMPLE_RUN) as run_file, RunFile.open(sample_dataset) as dataset:
        for table in sorted(RUN_TABLES):
            columns = f"SELECT column_name, column_type FROM (DESCRIBE {table})"  # not NOT NULL
            assert dataset.rows(columns) == run_file.rows(columns), table
            assert dataset.rows(EVERY_ROW.format(table)) == run_file.rows(
                EVERY_ROW.format(table)
            ), table
        assert dataset.finished


def test_the_dataset_is_partitioned_by_engine_and_date(sample_dataset: Path) -> None:
    with RunFile.open(SAMPLE_RUN) as run_file:
        run_id, day = run_file.row("SELECT run_id, CAST(started_at AS DATE) FROM runs") or ()
    assert [
        path.relative_to(sample_dataset).as_posix() for path in sample_dataset.rglob("*_*.parquet")
    ] == [
        f"{table}/engine=unnamed/date={day}/{run_id}_0.parquet" for table in ("events", "pool")
    ]  # the sample has no collisions: no file for them
    assert (sample_dataset / "runs" / f"{run_id}.parquet").is_file()
    marker = json.loads((sample_dataset / "kvscope_dataset.json").read_text())
    assert marker["tables"]["events"] == ["engine", "date"]
    assert marker["tables"]["requests"] == []
    assert set(marker["tables"]) == RUN_TABLES


def test_clickhouse_reads_the_dataset_with_its_partitions(sample_dataset: Path) -> None:
    # chdb is ClickHouse embedded: the README's query, with hive partitioning on, finds the
    # `engine` and `date` path parts as columns and every row of the run file.
    import chdb  # noqa: PLC0415 - chdb (embedded ClickHouse) is a dev extra, slow to load

    def clickhouse(sql: str) -> list[list[str]]:
        text = str(chdb.query(sql.format(dir=sample_dataset), "CSV"))
        return [line.replace('"', "").split(",") for line in text.strip().splitlines()]

    events = clickhouse(
        "SELECT engine, toString(date), count(), uniqExact(block_hash) "
        "FROM file('{dir}/events/**/*.parquet', Parquet) GROUP BY engine, date "
        "SETTINGS use_hive_partitioning = 1"
    )
    requests = clickhouse(
        "SELECT count(), sum(num_hit_tokens), sum(num_prompt_tokens) "
        "FROM file('{dir}/requests/*.parquet', Parquet)"
    )
    with RunFile.open(SAMPLE_RUN) as run_file:
        day = run_file.row("SELECT CAST(started_at AS DATE) FROM runs") or ()
        counted = run_file.row("SELECT count(*), count(DISTINCT block_hash) FROM events") or ()
        summed = run_file.row(
            "SELECT count(*), sum(num_hit_tokens), sum(num_prompt_tokens) FROM requests"
        )
    assert events == [["unnamed", str(day[0]), *map(str, counted)]]
    assert requests == [list(map(str, summed or ()))]


def test_the_app_shows_the_dataset_as_the_run_file(sample_dataset: Path) -> None:
    for page in PAGES:
        from_file = go_to(start(SAMPLE_RUN), page)
        from_dataset = go_to(start(sample_dataset), page)
        assert metrics(from_dataset) == metrics(from_file), page
    assert metrics(start(sample_dataset))["Requests"] == "500"


def engine_steps(engine_id: str, num_requests: int) -> list[list[Event]]:
    """An engine's records per step, its request ids its own (as vLLM's random ids are)."""
    steps = list(sample_engine_steps(SETTINGS, num_requests, engine_id))
    for record in itertools.chain.from_iterable(steps):
        if getattr(record, "request_id", None) is not None:
            record.request_id = f"{engine_id}-{record.request_id}"  # type: ignore[attr-defined]
    return steps


def record(run: Path, *engines: list[list[Event]]) -> Path:
    """What a collector receiving these engines' records, step by step, writes (a run id
    of its own: exports are named by it)."""
    store = RunStore.create(run, dataclasses.replace(CONFIG, run_id=run.stem))
    for number in itertools.count():
        taken = [record for steps in engines if number < len(steps) for record in steps[number]]
        if not taken:
            break
        store.append(taken)
    store.finalize()
    store.close()
    return run


@pytest.mark.vllm
def test_two_engines_datasets_open_as_the_run_of_both(tmp_path: Path) -> None:
    engine_a, engine_b = engine_steps("a", 60), engine_steps("b", 40)
    both = record(tmp_path / "both.duckdb", engine_a, engine_b)
    directories = []
    for name, steps in (("a", engine_a), ("b", engine_b)):
        with RunFile.open(record(tmp_path / f"{name}.duckdb", steps)) as run:
            export_parquet(run, tmp_path / name)
        directories.append(tmp_path / name)
    with RunFile.open(both) as run_file, RunFile.open_dataset(directories) as dataset:
        assert run_summary(dataset) == run_summary(run_file)
        assert run_summary(dataset)["requests"] == 60 + 40
        for table in sorted(RUN_TABLES - {"runs"}):
            # Both engines store a block first at the same record number: which one is its
            # first storer is a tie, settled either way in a run file too.
            rows = EVERY_ROW.format(
                {
                    "prefix_blocks": "(SELECT * EXCLUDE (first_stored_by) FROM prefix_blocks)",
                    # Each run's record of its own file's rows, not of the two together.
                    "meta": "(SELECT * FROM meta WHERE key <> 'contents')",
                }.get(table, table)
            )
            assert dataset.rows(rows) == run_file.rows(rows), table
        run_ids = dataset.row("SELECT run_id, num_blocks FROM runs")
    assert run_ids and "+" in run_ids[0] and run_ids[1] == SETTINGS.num_blocks
    for directory in directories:  # the two exports copied into one folder: the same run
        shutil.copytree(directory, tmp_path / "fleet", dirs_exist_ok=True)
    with RunFile.open(both) as run_file, RunFile.open(tmp_path / "fleet") as fleet:
        assert run_summary(fleet) == run_summary(run_file)


def tiny_dataset(directory: Path, **settings: int) -> Path:
    directory.mkdir()
    with RunFile.open(tiny_run(directory, SHARED_PREFIX, **settings)) as run:
        export_parquet(run, directory / "dataset")
    return directory / "dataset"


def test_runs_with_different_caches_or_a_shared_engine_are_refused(tmp_path: Path) -> None:
    six = tiny_dataset(tmp_path / "six", block_size=4, num_blocks=6)
    seven = tiny_dataset(tmp_path / "seven", block_size=4, num_blocks=7)
    with pytest.raises(StoreError, match="runs with different caches do not combine"):
        RunFile.open_dataset([six, seven])
    other_six = tiny_dataset(tmp_path / "other_six", block_size=4, num_blocks=6)
    with pytest.raises(StoreError, match=r"in more than one run do not combine \(unnamed\)"):
        RunFile.open_dataset([six, other_six])


def test_an_existing_target_or_a_missing_run_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "taken"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    assert main(["export", str(SAMPLE_RUN), "--parquet", str(target)]) == 2
    assert f"{target}: already exists" in capsys.readouterr().err
    assert [path.name for path in target.iterdir()] == ["notes.txt"]
    missing = tmp_path / "missing.duckdb"
    assert main(["export", str(missing), "--parquet", str(tmp_path / "out")]) == 2
    assert f"{missing}: no such run file" in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["taken"]


def test_a_failed_export_leaves_nothing_behind(tmp_path: Path) -> None:
    run = RunFile.open(shared_prefix_run(tmp_path / "run"))
    run.close()  # every query on it now fails, after the export began
    with pytest.raises(Exception, match="closed"):
        export_parquet(run, tmp_path / "dataset")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["run"]


def test_the_run_picker_offers_datasets_beside_run_files(tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    shutil.copy(SAMPLE_RUN, folder / "b.duckdb")
    assert main(["export", str(SAMPLE_RUN), "--parquet", str(folder / "a")]) == 0
    (folder / "notes").mkdir()  # a folder that is no dataset is not offered
    app = start(folder)
    picker = app.selectbox(key="run_picker")
    assert picker.options == ["a", "b.duckdb"]
    assert app.session_state["run_path"] == str(folder / "a")
    picker.select(str(folder / "b.duckdb")).run()
    assert app.session_state["run_path"] == str(folder / "b.duckdb")
    assert not app.exception


def report_figures(baseline: Path, out_dir: Path) -> dict[str, object]:
    """figures.json of `kvscope report` with `baseline` against the sample, paths left out."""
    arguments = ["--baseline", str(baseline), "--candidate", str(SAMPLE_RUN)]
    assert main(["report", *arguments, "--out-dir", str(out_dir)]) == 0
    figures = json.loads((out_dir / "figures.json").read_text())
    for side in ("baseline", "candidate"):
        figures[side].pop("path")
    return dict(figures)


def test_report_compares_a_dataset_as_its_run_file(sample_dataset: Path, tmp_path: Path) -> None:
    assert report_figures(sample_dataset, tmp_path / "dataset") == report_figures(
        SAMPLE_RUN, tmp_path / "file"
    )


@pytest.mark.vllm
def test_whatif_replays_a_datasets_requests_as_its_run_files(
    sample_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweeps = []
    for name, source in (("dataset", sample_dataset), ("file", SAMPLE_RUN)):
        capsys.readouterr()
        arguments = ["whatif", str(source), "--out", str(tmp_path / name), "--limit", "40"]
        assert main([*arguments, "--num-blocks", "400", "--jobs", "1", "--json", "--quiet"]) == 0
        sweeps.append([{**row, "seconds": None} for row in json.loads(capsys.readouterr().out)])
    assert sweeps[0] == sweeps[1] and sweeps[0][0]["requests"] == 40


def test_a_dataset_exported_before_manifests_is_read_its_runs_table_required(
    sample_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = tmp_path / "old"
    shutil.copytree(sample_dataset, old)
    shutil.rmtree(old / "manifests")
    marker = json.loads((old / "kvscope_dataset.json").read_text())
    (old / "kvscope_dataset.json").write_text(json.dumps({**marker, "format": 1}))
    assert summary_json(old, capsys) == summary_json(SAMPLE_RUN, capsys)
    shutil.rmtree(old / "runs")
    with pytest.raises(StoreError, match="runs: no Parquet file, and every run holds that table"):
        RunFile.open(old)
