"""The advisor on runs of several engines, built by fleet replays of a hand-built trace: the
curves are each engine's own, summed at a pool size per engine, so at the run's pool they
give what the fleet measured; rules that model one pool say why they do not judge a fleet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest

from collector.advisor import RULES, RunContext, advise
from collector.advisor.cache_size import FLEET_CURVE_SOURCE, SCHEDULER_SOURCE
from collector.advisor.curves import whatif_curves
from collector.advisor.scheduler_check import reason_to_skip
from collector.model.block_stream import RequestBlocks
from collector.model.mrc import fleet_curve, miss_ratio_curve
from collector.replay.block_manager import CacheSettings
from collector.replay.replayer import ReplayOptions, replay
from collector.store.run_file import RunFile
from tests.support.app import go_to, start
from tests.support.fleet import BLOCK_SIZE, FAMILIES, family_trace
from tests.support.repo import SECRET
from tests.support.sweeps import sweep_result

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version

NUM_PROMPT_TOKENS = 96  # eight prompts of 12 tokens


def fleet_run(
    directory: Path,
    num_blocks: int,
    engines: int = 2,
    rows: list[dict[str, Any]] | None = None,
    **options: Any,
) -> Path:
    """`rows` (the family trace, A A B B A A B B, by default) replayed round-robin across
    `engines` engines of `num_blocks` blocks of 4 each, one request at a time: each engine
    gets A B A B of the family trace."""
    trace = directory / "trace.jsonl"
    rows = family_trace() if rows is None else rows
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = directory / f"fleet-{engines}x{num_blocks}-{len(list(directory.iterdir()))}.duckdb"
    settings = CacheSettings(BLOCK_SIZE, num_blocks)
    replay(
        trace,
        out,
        ReplayOptions(
            settings=settings,
            timing="sequential",
            engines=engines,
            router="round-robin",
            record_token_ids=True,
            **options,
        ),
        SECRET,
    )
    return out


def measured_hit_tokens(run: Path) -> int:
    with RunFile.open(run) as run_file:
        return int(RunContext(run_file, run).summary["hit_tokens"])


def judge(run: Path, rule: str) -> tuple[str, str, list[Any]]:
    """What one rule says about a run: its status, its detail, its suggestions."""
    chosen = tuple(entry for entry in RULES if entry[0] == rule)
    with RunFile.open(run) as run_file:
        advice = advise(RunContext(run_file, run), chosen)
    (check,) = advice.checks
    return check.status, check.detail, advice.suggestions


def test_the_fleets_curve_at_its_pool_is_what_it_measured(tmp_path: Path) -> None:
    run = fleet_run(tmp_path, num_blocks=20)
    with RunFile.open(run) as run_file:
        context = RunContext(run_file, run)
        assert context.num_engines == 2
        # Each engine: A B A B, the second A and B hit their family's two blocks: 16 tokens.
        assert context.summary["hit_tokens"] == 32
        assert context.tokens_at(context.curve, 20) == 32
        assert context.curve.token_hit_ratio(20) == 32 / NUM_PROMPT_TOKENS
        # The recorded prompts, split by the engine each request arrived at, agree.
        assert context.tokens_at(context.token_curve(BLOCK_SIZE), 20) == 32
        # One pool for all eight requests would hit six of them: not this fleet.
        one_pool = miss_ratio_curve(context.block_stream, BLOCK_SIZE)
        assert context.tokens_at(one_pool, 20) == 48
        assert sorted(len(stream) for stream in context.engine_streams) == [4, 4]
        assert set(context.request_engines.values()) == {("engine-0", 0), ("engine-1", 0)}


def test_summing_pads_each_engines_curve_with_its_top() -> None:
    # Engine 1: one prompt of two blocks, twice: both hit from 2 usable blocks on.
    # Engine 2: three one-block prompts, the first again last: it hits from 4 usable on.
    first = miss_ratio_curve([RequestBlocks((1, 2), 9, 3)] * 2, 4)
    second = miss_ratio_curve([RequestBlocks((key,), 5, 2) for key in (7, 8, 9, 7)], 4)
    assert (len(first.hit_blocks), len(second.hit_blocks)) == (3, 5)
    fleet = fleet_curve([first, second])
    sizes = range(1, 8)  # pools per engine, null block included
    assert [fleet.hits_at(size) for size in sizes] == [0, 1, 2, 2, 3, 3, 3]
    assert [fleet.hits_at(size) for size in sizes] == [
        first.hits_at(size) + second.hits_at(size) for size in sizes
    ]
    assert (fleet.prompt_tokens, fleet.num_requests, fleet.min_num_blocks) == (38, 6, 4)


def test_cache_size_grows_each_engines_pool_as_a_fleet_replay_confirms(tmp_path: Path) -> None:
    run = fleet_run(tmp_path, num_blocks=4)  # 3 usable blocks: a request's own, no more
    assert measured_hit_tokens(run) == 0
    with RunFile.open(run) as run_file:
        one_pool = miss_ratio_curve(RunContext(run_file, run).block_stream, BLOCK_SIZE)
        assert one_pool.hits_at(4) * BLOCK_SIZE == 32  # one pool: the old, wrong reading
    status, _, (suggestion,) = judge(run, "cache-size")
    assert status == "fired"
    assert suggestion.title == "Grow the KV cache to 6 blocks per engine (+0.0 GiB per engine)"
    assert suggestion.action.endswith("(on each of the 2 engines)")
    figures = suggestion.figures
    assert figures["recommended_num_blocks"] == 6
    assert figures["current_token_hit_ratio"] == 0.0  # what the fleet measured
    assert figures["source"] == FLEET_CURVE_SOURCE
    # An independent fleet replay with 6 blocks per engine hits what the curve said.
    assert measured_hit_tokens(fleet_run(tmp_path, num_blocks=6)) == 32
    assert figures["recommended_token_hit_ratio"] == 32 / NUM_PROMPT_TOKENS
    assert suggestion.evidence[1].startswith("6 blocks per engine reach 33.3%")
    assert suggestion.charts[0].x_title == "KV cache blocks per engine"


@pytest.mark.parametrize(
    ("rule", "reason"),
    [
        (
            "cache-policy",
            "this run has 2 engines, each with its own pool; the policy replay models one pool "
            "(replay each engine's share of the trace, or compare routers with the routing "
            "rule)",
        ),
        (
            "cpu-tier",
            "this run has 2 engines, each with its own pool; the tier replay models one pool "
            "with one CPU tier behind it (replay each engine's share of the trace with "
            "--cpu-tier-blocks)",
        ),
    ],
)
def test_one_pool_rules_say_why_they_skip_a_fleet(tmp_path: Path, rule: str, reason: str) -> None:
    assert judge(fleet_run(tmp_path, num_blocks=20), rule)[:2] == ("skipped", reason)


def test_lora_budgets_the_duplicates_of_one_engines_pool(tmp_path: Path) -> None:
    # A B A B, the second A and B under an adapter: round-robin sends both A to engine 0 and
    # both B to engine 1, so each pool holds one family's two prefix blocks twice.
    rows = [
        {
            "request_id": f"{family}{number}",
            "timestamp": number * 100,
            "token_ids": FAMILIES[family] + [1_000 + 10 * number + k for k in range(4)],
            "output_length": 1,
            **({"lora": "x"} if number >= 2 else {}),
        }
        for number, family in enumerate("ABAB")
    ]
    run = fleet_run(tmp_path, num_blocks=20, rows=rows)
    status, _, (suggestion,) = judge(run, "lora-split")
    assert status == "fired"
    assert suggestion.figures["duplicate_blocks"] == 4  # over the run: both families
    # The budget is one pool's: 20 blocks and one family's 2 copies, on each engine.
    assert suggestion.action.endswith("`--num-gpu-blocks-override 22` (on each of the 2 engines)")


def test_the_scheduler_checks_a_fleet_engine_by_engine(tmp_path: Path) -> None:
    run = fleet_run(tmp_path, num_blocks=4)
    # As a live capture of two engines records it: requests overlapped on each engine.
    with duckdb.connect(str(run)) as connection:
        connection.execute("UPDATE runs SET timing = 'timestamps', max_num_seqs = 8")
    with RunFile.open(run) as run_file:
        assert reason_to_skip(RunContext(run_file, run)) == ""
    status, _, (suggestion,) = judge(run, "cache-size")
    assert status == "fired"
    figures = suggestion.figures
    assert figures["source"] == SCHEDULER_SOURCE
    # What the fleet replayed through the Scheduler, round-robin as the run was, measures.
    trace = tmp_path / "trace.jsonl"
    measured = {}
    for pool in (figures["current_num_blocks"], figures["recommended_num_blocks"]):
        replayed = replay(
            trace,
            tmp_path / f"scheduler-{pool}.duckdb",
            ReplayOptions(
                settings=CacheSettings(BLOCK_SIZE, pool),
                timing="scheduler",
                max_num_seqs=8,
                engines=2,
                router="round-robin",
            ),
            SECRET,
        )
        measured[pool] = replayed["token_hit_ratio"]
    assert [figures["current_token_hit_ratio"], figures["recommended_token_hit_ratio"]] == list(
        measured.values()
    )
    assert figures["recommended_token_hit_ratio"] > figures["current_token_hit_ratio"]


def test_a_sweep_of_one_pool_is_left_out_of_a_fleets_curves(tmp_path: Path) -> None:
    run = fleet_run(tmp_path, num_blocks=20)
    point = sweep_result(BLOCK_SIZE, 40, 0.5)
    with RunFile.open(run) as run_file:
        one_pool = RunContext(run_file, run, whatif=[point])
        assert one_pool.whatif_rows == []
        curves = whatif_curves(one_pool)
        assert [series.name for series in curves.series] == [
            f"block size {BLOCK_SIZE} (this run)",
            *(f"block size {size}" for size in (8, 16, 32, 64, 128)),
        ]
        assert curves.title.startswith("What-if: token hit ratio by KV cache size per engine")
        # A sweep of fleets: the run's own engines and router count, other routers do not.
        same = sweep_result(BLOCK_SIZE, 40, 0.5, engines=2, router="round-robin")
        other = sweep_result(BLOCK_SIZE, 40, 0.5, engines=2, router="prefix-affinity")
        fleet = RunContext(run_file, run, whatif=[same, other])
        assert fleet.whatif_rows == [same]


def test_advisor_page_on_a_fleet(tmp_path: Path) -> None:
    run = fleet_run(tmp_path, num_blocks=4)
    app = go_to(start(run, timeout_s=120), "views/advisor.py")
    assert not app.exception
    assert "2 engines of 4 blocks each" in app.caption[0].value
    assert "every pool size and memory figure is per engine" in app.info[0].value
    assert [element.value for element in app.subheader] == [
        "1. Prefix-aware routing would win 50.0 points over round-robin",
        "2. Grow the KV cache to 6 blocks per engine (+0.0 GiB per engine)",
        "Checks",
    ]
    charts = [json.loads(chart.proto.spec) for chart in app.get("plotly_chart")]
    assert "per engine" in charts[0]["layout"]["title"]["text"]
    (checks,) = [frame.value for frame in app.dataframe if "rule" in frame.value.columns]
    outcomes = {row.rule: (row.status, row.detail) for row in checks.itertuples()}
    for rule in ("cache-policy", "cpu-tier"):
        status, detail = outcomes[rule]
        assert status == "skipped"
        assert detail.startswith("this run has 2 engines, each with its own pool")


def test_cache_policies_page_skips_a_fleet(tmp_path: Path) -> None:
    run = fleet_run(tmp_path, num_blocks=4)
    app = go_to(start(run, timeout_s=120), "views/policies.py")
    assert not app.exception
    (info,) = [element.value for element in app.info]
    assert info.startswith("No policy replays for this run: this run has 2 engines")
    assert not app.get("plotly_chart")
