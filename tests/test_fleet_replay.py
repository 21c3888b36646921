"""Fleet replays (`--engines N --router R`): a hand-built trace whose answers are known."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from collector.cli import main
from collector.queries.pool import eviction_regret_summary, low_free_periods
from collector.queries.summary import run_summary
from collector.replay.fleet import DataParallelBalancer
from collector.store.run_file import RunFile
from tests.support.fleet import BLOCK_SIZE, ORDER, family_trace

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version


def replay_json(
    directory: Path,
    capsys: pytest.CaptureFixture[str],
    *options: str,
    trace_rows: list[dict[str, Any]] | None = None,
) -> Any:
    trace = directory / "trace.jsonl"
    rows = trace_rows or family_trace()
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = directory / f"run{len(list(directory.iterdir()))}.duckdb"
    argv = ["replay", str(trace), "--out", str(out), "--block-size", str(BLOCK_SIZE)]
    argv += ["--num-blocks", "20", "--timing", "sequential", "--json", "--quiet", *options]
    assert main(argv) == 0
    return out, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def per_engine(out: Path) -> dict[str, tuple[list[str], int]]:
    """Each engine's requests (in order) and hit tokens."""
    with RunFile.open(out) as run_file:
        rows = run_file.rows(
            "SELECT engine_id, list(request_id ORDER BY seq), sum(num_hit_tokens)::INTEGER "
            "FROM events WHERE kind = 'lookup' GROUP BY engine_id ORDER BY engine_id"
        )
    return {engine: (requests, hit_tokens) for engine, requests, hit_tokens in rows}


def duplicated_blocks(out: Path) -> int:
    """Block hashes stored on more than one engine."""
    with RunFile.open(out) as run_file:
        row = run_file.row(
            "SELECT count(*) FROM (SELECT block_hash FROM events WHERE kind = 'store' "
            "GROUP BY block_hash HAVING count(DISTINCT engine_id) > 1)"
        )
    assert row is not None
    return int(row[0])


ORDER_IDS = [f"{family}{number}" for number, family in enumerate(ORDER)]

# No evictions (20 blocks an engine; an engine caches at most 4 prefix + 4 own blocks).
# round-robin: engine-0 gets A0 B2 A4 B6, engine-1 A1 B3 A5 B7: each family misses once on
#   each engine, then hits its 8 tokens: 2 hits of 8 an engine, 32 in all; both engines
#   cache both families' 2 prefix blocks: 4 duplicated.
# prefix-affinity: A0 hits nowhere, goes to engine-0 (a tie: the lowest index); A1 hits
#   there; B2 hits nowhere, goes to the engine routed fewest, engine-1; then each family
#   stays on its engine: 3 hits of 8 an engine, 48 in all, nothing duplicated.
EXPECTED = {
    "round-robin": (
        {"engine-0": (["A0", "B2", "A4", "B6"], 16), "engine-1": (["A1", "B3", "A5", "B7"], 16)},
        4,
    ),
    "prefix-affinity": (
        {"engine-0": (["A0", "A1", "A4", "A5"], 24), "engine-1": (["B2", "B3", "B6", "B7"], 24)},
        0,
    ),
}


@pytest.mark.parametrize("router", sorted(EXPECTED))
def test_each_router_places_and_hits_as_worked_out_by_hand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], router: str
) -> None:
    out, figures = replay_json(tmp_path, capsys, "--engines", "2", "--router", router)
    engines, duplicated = EXPECTED[router]
    assert per_engine(out) == engines
    assert duplicated_blocks(out) == duplicated
    hit_tokens = sum(hits for _, hits in engines.values())
    assert (figures["requests"], figures["prompt_tokens"]) == (8, 96)
    assert (figures["hit_tokens"], figures["vllm_prefix_cache_hits"]) == (hit_tokens, hit_tokens)
    assert figures["evictions"] == 0
    # The stored run sums the engines the same way.
    assert main(["summary", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    # summary adds the latency figures (a sequential replay has no first tokens to time)
    assert summary.pop("latency") == {"by_hit_share": [], "clock": "modelled", "requests": 0}
    assert summary == figures
    with RunFile.open(out) as run_file:
        options = json.loads(run_file.rows("SELECT options FROM runs")[0][0])
    assert (options["engines"], options["router"]) == (2, router)


def test_prefix_affinity_beats_round_robin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, round_robin = replay_json(tmp_path, capsys, "--engines", "2")
    _, affinity = replay_json(tmp_path, capsys, "--engines", "2", "--router", "prefix-affinity")
    assert affinity["token_hit_ratio"] == 0.5 > round_robin["token_hit_ratio"] == 32 / 96


def test_least_loaded_balances_the_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, figures = replay_json(tmp_path, capsys, "--engines", "3", "--router", "least-loaded")
    requests = {engine: names for engine, (names, _) in per_engine(out).items()}
    assert requests == {
        "engine-0": ["A0", "B3", "B6"],
        "engine-1": ["A1", "A4", "B7"],
        "engine-2": ["B2", "A5"],
    }
    assert figures["requests"] == 8


def test_one_engine_is_the_plain_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, plain = replay_json(tmp_path, capsys)
    _, fleet = replay_json(tmp_path, capsys, "--engines", "1", "--router", "prefix-affinity")
    assert fleet == plain


def share_runs(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    timing: str = "sequential",
    trace: list[dict[str, Any]] | None = None,
) -> list[Path]:
    """Each round-robin engine's share of the trace (every other request), replayed alone
    with the fleet's settings."""
    trace, runs = trace or family_trace(), []
    for number in range(2):
        share = tmp_path / f"share{number}"
        share.mkdir()
        (share / "trace.jsonl").write_text(
            "".join(json.dumps(row) + "\n" for row in trace[number::2])
        )
        argv = ["replay", str(share / "trace.jsonl"), "--out", str(share / "run.duckdb")]
        argv += ["--block-size", "4", "--num-blocks", "6", "--timing", timing, "--json"]
        assert main([*argv, "--quiet"]) == 0
        capsys.readouterr()
        runs.append(share / "run.duckdb")
    return runs


def test_each_round_robin_engine_replays_as_a_plain_replay_of_its_share(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = replay_json(tmp_path, capsys, "--engines", "2", "--num-blocks", "6")
    for run, (_, hit_tokens) in zip(
        share_runs(tmp_path, capsys), per_engine(out).values(), strict=True
    ):
        with RunFile.open(run) as run_file:
            assert run_summary(run_file)["hit_tokens"] == hit_tokens


# The scheduler timing: each engine a vLLM Scheduler of its own, on one clock; a router reads
# an engine's load as the requests it is serving (waiting and running) at the arrival.
# Arrivals 100 ms apart: every request is done before the next arrives, so every load is 0.
# Round-robin places and hits as in the sequential timing. Prefix-affinity sends A0 to
# engine-0 (a tie: the lowest index) and every later request either hits there or ties
# again: all 8 on engine-0, hitting 6 x 8 tokens; least-loaded, always tied, does the same.
SPACED = {
    "round-robin": EXPECTED["round-robin"][0],
    "prefix-affinity": {"engine-0": (list(ORDER_IDS), 48)},
    "least-loaded": {"engine-0": (list(ORDER_IDS), 48)},
}


@pytest.mark.parametrize("router", sorted(SPACED))
def test_under_the_scheduler_each_router_places_as_worked_out_by_hand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], router: str
) -> None:
    options = ("--engines", "2", "--router", router, "--timing", "scheduler")
    out, figures = replay_json(tmp_path, capsys, *options)
    assert per_engine(out) == SPACED[router]
    hit_tokens = sum(hits for _, hits in SPACED[router].values())
    assert (figures["hit_tokens"], figures["vllm_prefix_cache_hits"]) == (hit_tokens, hit_tokens)
    with RunFile.open(out) as run_file:
        assert run_file.rows("SELECT timing FROM runs") == [("scheduler",)]
    if router == "prefix-affinity":  # the fleet's gain, measured both ways
        _, round_robin = replay_json(tmp_path, capsys, *options[:2], "--timing", "scheduler")
        assert figures["token_hit_ratio"] == 0.5 > round_robin["token_hit_ratio"] == 32 / 96


def burst() -> list[dict[str, Any]]:
    """The family trace, every request arriving at once."""
    return [{**row, "timestamp": 0} for row in family_trace()]


def test_in_a_burst_nothing_is_cached_yet_so_prefix_affinity_places_by_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # All 8 arrive before the first step: no engine caches anything when each is routed, and
    # each goes to the engine serving fewest (ties: the lowest index), alternately.
    options = ("--engines", "2", "--timing", "scheduler")
    out, _ = replay_json(
        tmp_path, capsys, *options, "--router", "prefix-affinity", trace_rows=burst()
    )
    placed = {engine: names for engine, (names, _) in per_engine(out).items()}
    assert placed == {engine: names for engine, (names, _) in EXPECTED["round-robin"][0].items()}


def test_under_the_scheduler_each_engine_replays_as_a_plain_replay_of_its_share(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One clock, but each engine's scheduler sees only its own requests: a burst into a
    # 6-block pool (batched prefills, evictions) gives each engine what its share gives alone.
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    options = ("--engines", "2", "--num-blocks", "6", "--timing", "scheduler")
    out, _ = replay_json(fleet, capsys, *options, trace_rows=burst())
    alone = share_runs(tmp_path, capsys, "scheduler", burst())
    for run, (_, hit_tokens) in zip(alone, per_engine(out).values(), strict=True):
        with RunFile.open(run) as run_file:
            assert run_summary(run_file)["hit_tokens"] == hit_tokens
    assert figures(out) == pytest.approx(
        [first + second for first, second in zip(*map(figures, alone), strict=True)]
    )
    assert figures(out)[1] > 0  # evictions: the pools ran full


def figures(run: Path) -> list[float]:
    """What the pages read across a run's engines: stretches under half the pool free (each
    engine's own), evictions and those stored again on their engine, cached lifetimes ended
    by an eviction and the hits they got."""
    with RunFile.open(run) as run_file:
        stretches = len(low_free_periods(run_file, threshold=0.5))
        regret = eviction_regret_summary(run_file)
        evicted, hits = run_file.row(
            "SELECT count(*) FILTER (WHERE ended_by = 'evict'), sum(hits) FROM cache_lifetimes"
        ) or (0, 0)
    return [stretches, regret["evictions"], regret["restored"], evicted, hits]


def test_a_fleets_figures_are_its_engines_summed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Block ids and record numbers count per engine: pool steps last until the same engine's
    # next step, an eviction ends the lifetime of that engine's block, and an evicted block
    # is "stored again" only on its own engine.
    out, _ = replay_json(tmp_path, capsys, "--engines", "2", "--num-blocks", "6")
    alone = [figures(run) for run in share_runs(tmp_path, capsys)]
    summed = [first + second for first, second in zip(*alone, strict=True)]
    assert figures(out) == pytest.approx(summed)
    assert summed[0] > 0 and summed[1] > 0 and summed[3] > 0


def per_rank(out: Path) -> dict[tuple[str, int], tuple[list[str], int]]:
    """Each DP rank's requests (in order) and hit tokens."""
    with RunFile.open(out) as run_file:
        rows = run_file.rows(
            "SELECT engine_id, dp_rank, list(request_id ORDER BY seq),"
            " sum(num_hit_tokens)::INTEGER FROM events WHERE kind = 'lookup'"
            " GROUP BY ALL ORDER BY ALL"
        )
    return {(engine, rank): (requests, hits) for engine, rank, requests, hits in rows}


def test_an_engines_dp_ranks_take_turns_as_vllms_balancer_gives_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One engine of 2 DP ranks, one request at a time: every rank is idle at each arrival,
    # so vLLM's balancer gives the requests to the ranks in turn, knowing nothing of
    # prefixes: each rank holds the round-robin engine's share and hits as it does.
    out, figures = replay_json(tmp_path, capsys, "--dp-size", "2", "--router", "prefix-affinity")
    round_robin = EXPECTED["round-robin"][0]
    assert per_rank(out) == {
        ("engine-0", 0): round_robin["engine-0"],
        ("engine-0", 1): round_robin["engine-1"],
    }
    assert figures["hit_tokens"] == figures["vllm_prefix_cache_hits"] == 32
    with RunFile.open(out) as run_file:
        options = json.loads(run_file.rows("SELECT options FROM runs")[0][0])
    assert (options["engines"], options["dp_size"]) == (1, 2)


def test_the_router_picks_the_engine_and_vllm_the_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 2 engines of 2 ranks behind prefix-affinity, which reads an engine's longest cached
    # prefix over its ranks and its load summed. A0 goes to engine-0 (a tie), rank 0; A1 to
    # engine-0 (it holds A), whose balancer has moved on: rank 1, a miss; B2, cached nowhere,
    # to the engine routed fewest, engine-1, rank 0; B3 to engine-1, rank 1, a miss. Then
    # each family returns to its engine and each request to the rank that missed it: 4 hits
    # of 8, where 4 engines behind prefix-affinity hit 6. A and B are cached on 2 ranks each.
    options = ("--router", "prefix-affinity")
    out, figures = replay_json(tmp_path, capsys, "--engines", "2", "--dp-size", "2", *options)
    assert per_rank(out) == {
        ("engine-0", 0): (["A0", "A4"], 8),
        ("engine-0", 1): (["A1", "A5"], 8),
        ("engine-1", 0): (["B2", "B6"], 8),
        ("engine-1", 1): (["B3", "B7"], 8),
    }
    with RunFile.open(out) as run_file:
        row = run_file.row(
            "SELECT count(*) FROM (SELECT block_hash FROM events WHERE kind = 'store'"
            " GROUP BY block_hash HAVING count(DISTINCT (engine_id, dp_rank)) > 1)"
        )
    assert row == (4,)
    _, ranks_as_engines = replay_json(tmp_path, capsys, "--engines", "4", *options)
    assert figures["token_hit_ratio"] == 32 / 96 < ranks_as_engines["token_hit_ratio"] == 0.5


def test_under_the_scheduler_a_burst_alternates_over_the_ranks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # All 8 arrive at once: vLLM's balancer gives each to the rank with fewest requests in
    # flight (ties: where its scan starts, one rank further each time): alternately.
    options = ("--dp-size", "2", "--timing", "scheduler")
    out, _ = replay_json(tmp_path, capsys, *options, trace_rows=burst())
    placed = {rank: names for rank, (names, _) in per_rank(out).items()}
    assert placed == {
        ("engine-0", 0): ["A0", "B2", "A4", "B6"],
        ("engine-0", 1): ["A1", "B3", "A5", "B7"],
    }


@dataclass
class RankFigures:
    """A rank as vLLM's DP coordinator reports it."""

    waiting: int
    running: int
    kv_usage: float
    load: int = 0

    def cached_prefix_blocks(self, block_hashes: object) -> int:
        return 0


def test_vllms_balancer_weighs_waiting_requests_by_kv_cache_pressure() -> None:
    # vLLM scores a rank max(in flight, waiting + running), plus 6 x waiting x (usage - 0.5)
    # when over half full: 2 waiting at 90 % score 2 + 4.8 = 6.8 against 4 running: the
    # second rank. At 50 % the penalty is 0 and the first rank's 2 win.
    balancer = DataParallelBalancer(2)
    busy = RankFigures(waiting=0, running=4, kv_usage=0.1)
    assert balancer.pick([RankFigures(2, 0, 0.9), busy], "r0") == 1
    assert balancer.pick([RankFigures(2, 0, 0.5), busy], "r1") == 0
    idle = [RankFigures(0, 0, 0.0), RankFigures(0, 0, 0.0)]
    assert [balancer.pick(idle, f"r{n}") for n in range(2, 5)] == [0, 1, 0]  # turns


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--engines", "0"], "--engines must be at least 1, got 0"),
        (["--dp-size", "0"], "--dp-size must be at least 1, got 0"),
        (
            ["--dp-size", "2", "--timing", "timestamps"],
            "a fleet replay (--engines 1 --dp-size 2) takes --timing sequential or scheduler",
        ),
        (
            ["--engines", "2", "--timing", "timestamps"],
            "a fleet replay (--engines 2) takes --timing sequential or scheduler, not",
        ),
        (["--engines", "2", "--timing", "sequential", "--cpu-tier-blocks", "8"], "no CPU tier"),
        (["--router", "random"], "argument --router: invalid choice: 'random'"),
    ],
)
def test_bad_fleet_options_exit_2_with_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], message: str
) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(json.dumps(family_trace()[0]) + "\n")
    out = tmp_path / "run.duckdb"
    argv = ["replay", str(trace), "--out", str(out), "--quiet", *options]
    try:
        code = main(argv)
    except SystemExit as error:  # argparse's own refusal
        code = error.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
