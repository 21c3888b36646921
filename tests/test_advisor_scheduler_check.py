"""The cache-size rule checks the one-pass curve's pick through vLLM's Scheduler when the
run's requests overlapped: its ratios are those of independent scheduler replays of the same
trace; a run replayed one request at a time keeps the curve, which is exact for it."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from collector.advisor import RULES, RunContext, advise
from collector.advisor.cache_size import (
    CURVE_SOURCE,
    SCHEDULER_SOURCE,
    SizeSource,
    recommend_size,
)
from collector.advisor.scheduler_check import reason_to_skip, scheduler_check
from collector.model.kv_memory import MODELS
from collector.replay.block_manager import CacheSettings
from collector.replay.replayer import ReplayOptions, replay
from collector.store.run_file import RunFile
from tests.support.block_manager import tiny_run
from tests.support.python_script import run_python
from tests.support.repo import SECRET

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version

CACHE_SIZE = tuple(entry for entry in RULES if entry[0] == "cache-size")


def paired_rows() -> list[dict[str, Any]]:
    """Four prompts of 9 tokens (two full blocks of 4) sent round-robin, two arriving at once,
    each decoding 2 tokens: the curve's pick is 10 blocks, one request at a time."""
    prompts = [
        random.Random(100 + number).choices(range(1_000, 30_000), k=9) for number in (0, 1, 2, 3)
    ]
    return [
        {
            "request_id": f"r{index}",
            "timestamp": (index // 2) * 5,
            "token_ids": prompts[index % 4],
            "output_length": 2,
        }
        for index in range(32)
    ]


def run_of(tmp_path: Path, num_blocks: int, **options: Any) -> Path:
    return tiny_run(tmp_path, paired_rows(), num_blocks=num_blocks, **options)


def scheduler_replay_ratio(trace: Path, num_blocks: int, **options: Any) -> float:
    """The token hit ratio of the trace replayed anew through vLLM's Scheduler."""
    named = "".join(f"-{name}{value}" for name, value in sorted(options.items()))
    out = trace.with_name(f"scheduler-{num_blocks}{named}.duckdb")
    settings = CacheSettings(4, num_blocks)
    summary = replay(trace, out, ReplayOptions(settings, timing="scheduler", **options), SECRET)
    return summary["token_hit_ratio"]


def test_a_concurrent_run_takes_the_ratios_of_scheduler_replays(tmp_path: Path) -> None:
    run = run_of(tmp_path, 9, timing="timestamps", max_num_seqs=2, record_token_ids=True)
    with RunFile.open(run) as run_file:
        context = RunContext(run_file, run)
        recommendation = recommend_size(context)
        curve = context.curve
        (grow,) = advise(context, CACHE_SIZE).suggestions
    assert recommendation.source is SizeSource.SCHEDULER
    assert recommendation.num_blocks == 10  # the curve picked it
    trace = tmp_path / "trace.jsonl"
    assert recommendation.current_ratio == scheduler_replay_ratio(trace, 9, max_num_seqs=2)
    assert recommendation.ratio == scheduler_replay_ratio(trace, 10, max_num_seqs=2)
    # Two requests at once hold blocks the curve, one request at a time, counts as cached.
    assert recommendation.ratio < curve.token_hit_ratio(10)
    assert grow.figures["source"] == SCHEDULER_SOURCE
    assert grow.figures["current_token_hit_ratio"] == recommendation.current_ratio
    assert grow.figures["recommended_token_hit_ratio"] == recommendation.ratio
    assert grow.effect.endswith(f"per the {SCHEDULER_SOURCE}")
    assert any(line.endswith(f"source: {SCHEDULER_SOURCE}") for line in grow.evidence)
    assert "the Scheduler replays overlap its requests as they arrived" in grow.evidence[2]


def test_contexts_of_one_run_share_its_scheduler_replays(tmp_path: Path) -> None:
    # The app keeps one run file's replays across changes of assumptions (model, GPU): they
    # depend on the run alone. A second context given the first's replays replays nothing.
    run = run_of(tmp_path, 9, timing="timestamps", max_num_seqs=2, record_token_ids=True)
    shared: dict[tuple[int, ...], Any] = {}
    with RunFile.open(run) as run_file:
        first = recommend_size(RunContext(run_file, run, scheduler_checks=shared))
        ((pools, check),) = shared.items()
        assert pools == (9, 10) and check.ratios == {9: first.current_ratio, 10: first.ratio}
        other = RunContext(run_file, run, MODELS["qwen2.5-7b"], scheduler_checks=shared)
        assert scheduler_check(other, pools) is check
        assert recommend_size(other).ratio == first.ratio


def test_the_check_replays_with_the_runs_own_scheduler_settings(tmp_path: Path) -> None:
    settings = {"max_num_seqs": 3, "max_num_batched_tokens": 8}
    run = run_of(tmp_path, 9, timing="scheduler", record_token_ids=True, **settings)
    with RunFile.open(run) as run_file:
        context = RunContext(run_file, run)
        recommendation = recommend_size(context)
        measured = context.summary["token_hit_ratio"]
    # The run was itself a scheduler replay: at its own pool the check takes what it measured
    # (replaying nothing), which is what a fresh replay gives: a replay is deterministic.
    assert recommendation.current_ratio == measured > 0
    trace = tmp_path / "trace.jsonl"
    assert measured == scheduler_replay_ratio(trace, 9, **settings)
    assert recommendation.ratio == scheduler_replay_ratio(trace, 10, **settings)
    # Another batch budget would give another figure: the run's own is the one replayed.
    assert recommendation.ratio != scheduler_replay_ratio(trace, 10, max_num_seqs=3)


def test_a_sequential_run_keeps_the_curve_which_is_exact_for_it(tmp_path: Path) -> None:
    run = run_of(tmp_path, 9, timing="sequential", record_token_ids=True)
    with RunFile.open(run) as run_file:
        context = RunContext(run_file, run)
        recommendation = recommend_size(context)
        (grow,) = advise(context, CACHE_SIZE).suggestions
        assert recommendation.current_ratio == context.summary["token_hit_ratio"]
        assert recommendation.ratio == context.curve.token_hit_ratio(10)
    assert recommendation.source is SizeSource.CURVE
    assert recommendation.curve_note == (
        "the one-pass curve is exact for this run, which ran one request at a time"
    )
    assert recommendation.curve_note in grow.evidence


def test_a_run_without_its_prompts_keeps_the_curve_and_says_why(tmp_path: Path) -> None:
    run = run_of(tmp_path, 9, timing="scheduler", max_num_seqs=2)
    with RunFile.open(run) as run_file:
        context = RunContext(run_file, run)
        recommendation = recommend_size(context)
        (grow,) = advise(context, CACHE_SIZE).suggestions
        assert recommendation.ratio == context.curve.token_hit_ratio(10)
    assert recommendation.source is SizeSource.CURVE
    assert recommendation.curve_note == (
        "the curve's figures are not checked through vLLM's Scheduler: the run did not record "
        "its prompts' token ids (replay with --record-token-ids, or run `kvscope whatif` on "
        "its trace)"
    )
    assert recommendation.curve_note in grow.evidence


def test_a_run_too_large_to_replay_in_seconds_is_not_replayed(tmp_path: Path) -> None:
    run = run_of(tmp_path, 9, timing="scheduler", max_num_seqs=2, record_token_ids=True)
    with RunFile.open(run) as run_file:
        context = RunContext(run_file, run)
        assert reason_to_skip(context) == ""
        assert reason_to_skip(context, max_prompt_tokens=287) == (
            "the curve's figures are not checked through vLLM's Scheduler: the run has 288 "
            "prompt tokens, more than the 287 the advisor replays (run `kvscope whatif RUN "
            "--timing scheduler` for its pool sizes)"
        )


# Makes vLLM (and torch) unimportable in a fresh interpreter, as a base install has neither.
WITHOUT_VLLM = """
import sys
from pathlib import Path

class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("vllm", "torch"):
            raise ImportError(f"No module named {name!r} (hidden by the test)")

sys.meta_path.insert(0, Absent())
from collector.advisor import RunContext
from collector.advisor.cache_size import phrase_source, recommend_size
from collector.store.run_file import RunFile

run = Path(sys.argv[1])
with RunFile.open(run) as run_file:
    recommendation = recommend_size(RunContext(run_file, run))
print(phrase_source(recommendation))
print(recommendation.curve_note)
"""


def test_without_vllm_the_curve_stands_and_says_why(tmp_path: Path) -> None:
    run = run_of(tmp_path, 9, timing="scheduler", max_num_seqs=2, record_token_ids=True)
    result = run_python(WITHOUT_VLLM, str(run), check=True, timeout=120)
    assert result.stdout.splitlines() == [
        CURVE_SOURCE,
        "the curve's figures are not checked through vLLM's Scheduler: this environment has "
        "no vLLM kvscope supports",
    ]
