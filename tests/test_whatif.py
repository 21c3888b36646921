"""`kvscope whatif`: parallel replays through vLLM into run files the app reads like any run."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from collector.advisor import RunContext
from collector.advisor.cache_size import SizeSource, phrase_source, recommend_size
from collector.cli import main
from collector.model.kv_memory import MODELS
from collector.queries.summary import run_summary
from collector.replay.block_manager import CacheSettings
from collector.replay.replayer import ReplayOptions
from collector.replay.sweep_point import SweepPoint
from collector.replay.whatif import (
    Source,
    read_results,
    run_sweep,
    sweep_document,
    sweep_points,
    write_results,
)
from collector.store.run_file import RunFile, RunStore
from tests.support.block_manager import tiny_run
from tests.support.fleet import family_trace
from tests.support.repo import SAMPLE_TRACE, SECRET

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version

SYSTEM = list(range(100, 124))  # 24 shared tokens: 6 blocks of 4, 3 of 8


def chat_rows() -> list[dict[str, object]]:
    """Two-turn chats on a shared system prompt; the second turns (all after the first turns)
    quote the first answer."""
    rows: list[dict[str, object]] = []
    for chat in range(6):
        question = [1_000 + chat * 10 + offset for offset in range(6)]
        answer = [2_000 + chat * 10 + offset for offset in range(9)]
        first = SYSTEM + question
        rows.append(
            {
                "request_id": f"chat-{chat}-turn-0",
                "timestamp": chat * 10,
                "token_ids": first,
                "output_length": len(answer),
                "output_token_ids": answer,
                "tenant": "acme",
            }
        )
        rows.append(
            {
                "request_id": f"chat-{chat}-turn-1",
                "timestamp": 100 + chat * 10,
                "token_ids": [*first, *answer, 3_000 + chat],
                "output_length": 3,
                "tenant": "acme",
            }
        )
    return sorted(rows, key=lambda row: row["timestamp"])  # type: ignore[arg-type, return-value]


def chat_trace(tmp_path: Path) -> Path:
    """`chat_rows` as a trace file in `tmp_path`."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(row) + "\n" for row in chat_rows()))
    return trace


@pytest.mark.slow  # two worker processes each import vLLM
def test_whatif_on_a_trace_writes_comparable_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = chat_trace(tmp_path)
    out = tmp_path / "sweep"
    argv = ["whatif", str(trace), "--out", str(out), "--block-size", "4,8", "--kv-gib", "0.01"]
    argv += ["--model", "llama-3.1-8b", "--num-layers", "1", "--jobs", "2", "--quiet", "--json"]
    assert main(argv) == 0
    results = json.loads(capsys.readouterr().out)
    # 0.01 GiB at 4 KiB per token (1 layer): 2,621 tokens = 655 blocks of 4, 327 of 8.
    assert [(row["block_size"], row["num_blocks"]) for row in results] == [(4, 655), (8, 327)]
    assert [result.to_json() for result in read_results(out).results] == results
    for row in results:
        store = RunStore.open(out / row["run"])
        try:
            summary = run_summary(store)
        finally:
            store.close()
        assert summary["token_hit_ratio"] == row["token_hit_ratio"]
        assert summary["block_size"] == row["block_size"]
        assert summary["requests"] == 12
    # Block size 8 loses the tail of the shared prompt and of the quoted answer.
    assert results[0]["hit_tokens"] > results[1]["hit_tokens"] > 0


def test_whatif_on_a_run_replays_its_recorded_requests(tmp_path: Path) -> None:
    run = tiny_run(tmp_path, chat_rows(), num_blocks=14, record_token_ids=True)
    with RunFile.open(run) as run_file:
        original = run_summary(run_file)
    options = ReplayOptions(settings=CacheSettings(4, 14), reveal_tenants=True)
    points = [SweepPoint(4, 14, 1), SweepPoint(4, 400, 1)]
    totals: list[int] = []
    counted: list[int] = []
    results = run_sweep(
        Source(run),
        points,
        tmp_path / "sweep",
        options,
        secret=SECRET,
        jobs=1,
        progress=counted.append,
        total=totals.append,
    )
    same, larger = results
    # The progress counts requests, every point's: each of the run's, twice.
    assert totals == [2 * original["requests"]]
    assert sum(counted) == totals[0]
    # The same settings give the same run: the quoted answers come back from stored blocks.
    assert same.hit_tokens == original["hit_tokens"]
    assert same.evictions == original["evictions"] > 0
    assert larger.hit_tokens > same.hit_tokens
    # advise --whatif takes the cache size from these replays instead of the curve.
    sweep = sweep_document(Source(run), options, MODELS["llama-3.1-8b"], results)
    write_results(tmp_path / "sweep", sweep)
    assert read_results(tmp_path / "sweep") == sweep
    with RunFile.open(run) as run_file:
        context = RunContext(run_file, run, whatif=read_results(tmp_path / "sweep").results)
        recommendation = recommend_size(context)
    assert recommendation.source is SizeSource.WHATIF
    assert phrase_source(recommendation) == "what-if replays through vLLM (2 pool sizes)"
    assert recommendation.num_blocks == 400
    assert recommendation.ratio == larger.token_hit_ratio


def test_whatif_sweeps_cpu_tiers_as_an_axis(tmp_path: Path) -> None:
    # The thrashing pool of the recorded run, without a tier and with one of each policy:
    # the tier catches what the pool evicts; the GPU pool's own hits do not change.
    run = tiny_run(tmp_path, chat_rows(), num_blocks=14, record_token_ids=True)
    points = sweep_points([4], [1], num_blocks=[14], tiers=[(0, "arc"), (40, "lru"), (40, "arc")])
    assert [(point.cpu_tier_blocks, point.cpu_tier_policy) for point in points] == [
        (0, "lru"),
        (40, "arc"),
        (40, "lru"),
    ]
    assert points[2].run_name == "bs4-blocks14-seqs1-tier40lru.duckdb"
    options = ReplayOptions(settings=CacheSettings(4, 14), reveal_tenants=True)
    bare, arc, lru = run_sweep(
        Source(run), points, tmp_path / "sweep", options, secret=SECRET, jobs=1
    )
    assert bare.tier_hit_tokens == 0
    assert lru.hit_tokens == arc.hit_tokens == bare.hit_tokens
    assert lru.tier_hit_tokens > 0 and arc.tier_hit_tokens > 0
    with RunFile.open(tmp_path / "sweep" / lru.run) as run_file:
        assert run_summary(run_file)["tier_hit_tokens"] == lru.tier_hit_tokens


def test_whatif_replays_through_vllms_scheduler(tmp_path: Path) -> None:
    run = tiny_run(tmp_path, chat_rows(), num_blocks=14, record_token_ids=True)
    options = ReplayOptions(
        settings=CacheSettings(4, 14),
        timing="scheduler",
        max_num_seqs=2,
        max_num_batched_tokens=16,
        reveal_tenants=True,
    )
    points = [SweepPoint(4, 14, 2), SweepPoint(4, 400, 2)]
    small, large = run_sweep(
        Source(run), points, tmp_path / "sweep", options, secret=SECRET, jobs=1
    )
    assert large.hit_tokens > small.hit_tokens
    with RunFile.open(tmp_path / "sweep" / large.run) as run_file:
        config = run_file.record(
            "SELECT timing, options->>'max_num_batched_tokens' AS budget FROM runs"
        )
        summary = run_summary(run_file)
    assert config == {"timing": "scheduler", "budget": "16"}
    # vLLM's own counters, summed over the scheduler's steps, equal the hooks' lookups.
    assert summary["vllm_prefix_cache_hits"] == summary["hit_tokens"] == large.hit_tokens


@pytest.mark.parametrize(
    ("make_input", "options", "errors"),
    [
        (
            lambda tmp_path: tiny_run(tmp_path, chat_rows(), num_blocks=40),
            [],
            ["{input}: the run holds no prompt token ids", "--record-token-ids"],
        ),
        (
            chat_trace,
            ["--block-size", "4", "--num-blocks", "8,40"],
            ["{input}:7: request chat-0-turn-1 needs 12 blocks of 4 tokens"],
        ),
    ],
    ids=["a run without token ids", "a pool too small for a request, before any replay"],
)
def test_bad_input_is_refused_before_anything_is_written(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    make_input: Callable[[Path], Path],
    options: list[str],
    errors: list[str],
) -> None:
    source = make_input(tmp_path)
    out = tmp_path / "sweep"
    assert main(["whatif", str(source), "--out", str(out), *options, "--quiet"]) == 2
    error = capsys.readouterr().err
    for expected in errors:
        assert expected.format(input=source) in error
    assert not out.exists()


def test_existing_runs_are_not_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = chat_trace(tmp_path)
    out = tmp_path / "sweep"
    out.mkdir()
    taken = out / SweepPoint(16, 20_000, 256).run_name
    taken.write_text("not a run")
    assert main(["whatif", str(trace), "--out", str(out), "--quiet"]) == 2
    assert f"{taken}: already exists" in capsys.readouterr().err
    assert taken.read_text() == "not a run"
    assert sorted(path.name for path in out.iterdir()) == [taken.name]


def _sweep_timings(sweep: Path) -> dict[str, tuple[str, str | None]]:
    """Each point's run: its timing and token budget."""
    timings = {}
    for run in sorted(sweep.glob("*.duckdb")):
        with RunFile.open(run) as run_file:
            config = run_file.record(
                "SELECT timing, options->>'max_num_batched_tokens' AS budget FROM runs"
            )
        timings[run.name] = (config["timing"], config["budget"])
    return timings


def test_a_sweep_takes_the_runs_timing_and_a_trace_the_scheduler(tmp_path: Path) -> None:
    # A run replayed through the scheduler: its sweep replays the same way, with the run's
    # token budget; a trace (no timing of its own) gets the scheduler, vLLM's default budget.
    run = tiny_run(
        tmp_path,
        chat_rows(),
        num_blocks=14,
        record_token_ids=True,
        timing="scheduler",
        max_num_seqs=2,
        max_num_batched_tokens=16,
    )
    assert main(["whatif", str(run), "--out", str(tmp_path / "a"), "--quiet", "--jobs", "1"]) == 0
    assert set(_sweep_timings(tmp_path / "a").values()) == {("scheduler", "16")}
    trace = tmp_path / "trace.jsonl"
    assert main(["whatif", str(trace), "--out", str(tmp_path / "b"), "--quiet", "--jobs", "1"]) == 0
    assert set(_sweep_timings(tmp_path / "b").values()) == {("scheduler", "8192")}
    # A run replayed one request at a time keeps that (the one-pass curve's exact model).
    (tmp_path / "seq").mkdir()
    sequential = tiny_run(tmp_path / "seq", chat_rows(), num_blocks=14, record_token_ids=True)
    out = tmp_path / "c"
    assert main(["whatif", str(sequential), "--out", str(out), "--quiet", "--jobs", "1"]) == 0
    assert set(_sweep_timings(out).values()) == {("sequential", None)}


def test_a_scheduler_sweep_runs_a_tier_through_vllms_connector(tmp_path: Path) -> None:
    run = tiny_run(tmp_path, chat_rows(), num_blocks=14, record_token_ids=True)
    options = ReplayOptions(
        settings=CacheSettings(4, 14), timing="scheduler", max_num_seqs=1, reveal_tenants=True
    )
    points = sweep_points([4], [1], num_blocks=[14], tiers=[(0, "lru"), (40, "lru")])
    bare, tier = run_sweep(Source(run), points, tmp_path / "sweep", options, secret=SECRET, jobs=1)
    assert bare.tier_hit_tokens == 0 and tier.tier_hit_tokens > 0
    assert tier.hit_tokens == bare.hit_tokens
    with RunFile.open(tmp_path / "sweep" / tier.run) as run_file:
        media = run_file.rows("SELECT DISTINCT medium FROM vllm_kv_events")
    assert media == [("CPU",)]


def test_fleets_are_an_axis_named_only_above_one_engine() -> None:
    points = sweep_points(
        [16], [1], num_blocks=[300], fleets=[(1, "prefix-affinity"), (4, "prefix-affinity")]
    )
    assert points == [
        SweepPoint(16, 300, 1),  # one engine routes nothing: round-robin, as every replay
        SweepPoint(16, 300, 1, engines=4, router="prefix-affinity"),
    ]
    assert points[0].run_name == "bs16-blocks300-seqs1.duckdb"
    assert points[1].run_name == "bs16-blocks300-seqs1-engines4-prefix-affinity.duckdb"


def test_a_fleet_sweep_takes_the_sequential_or_the_scheduler_timing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep"
    argv = ["whatif", str(SAMPLE_TRACE), "--out", str(out), "--engines", "2", "--quiet"]
    assert main([*argv, "--timing", "timestamps"]) == 2
    error = capsys.readouterr().err
    assert "a fleet replay (--engines 2) takes --timing sequential or scheduler" in error
    assert not out.exists()


@pytest.mark.parametrize(("dp_size", "hit_tokens"), [(1, 48), (2, 32)])
def test_a_fleet_runs_sweep_replays_its_fleet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dp_size: int, hit_tokens: int
) -> None:
    # A run of two engines (of 1 or 2 DP ranks) behind prefix-affinity: its sweep defaults to
    # that fleet and gives the run's own hits (tests/test_fleet_replay.py: 48 and 32 tokens).
    run = tiny_run(
        tmp_path,
        family_trace(),
        block_size=4,
        num_blocks=20,
        engines=2,
        router="prefix-affinity",
        dp_size=dp_size,
        record_token_ids=True,
    )
    out = tmp_path / "sweep"
    assert main(["whatif", str(run), "--out", str(out), "--quiet", "--jobs", "1", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["engines"], row["dp_size"], row["router"]) == (2, dp_size, "prefix-affinity")
    assert row["hit_tokens"] == hit_tokens
    assert row["run"] == "bs4-blocks20-seqs1-engines2-prefix-affinity.duckdb"
