"""The routing rule on two-engine runs built by fleet replays of hand-built traces: its
ratios are those of independent fleet replays of the same trace behind each router."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from collector.advisor import RunContext
from collector.advisor.routing import routing
from collector.advisor.suggestion import NotApplicable, NothingToWin
from collector.model.kv_memory import MODELS, gib_for_blocks
from collector.queries.summary import run_summary
from collector.replay.block_manager import CacheSettings
from collector.replay.replayer import ReplayOptions, replay
from collector.store.run_file import RunFile
from tests.support.fleet import family_trace
from tests.support.repo import SECRET

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version


def distinct_trace() -> list[dict[str, Any]]:
    """Eight prompts of 12 tokens sharing nothing: no router can make one hit."""
    return [
        {
            "request_id": f"r{number}",
            "timestamp": number * 100,
            "token_ids": [10_000 + 100 * number + k for k in range(12)],
            "output_length": 1,
        }
        for number in range(8)
    ]


def fleet_run(
    directory: Path, rows: list[dict[str, Any]], router: str, engines: int = 2, **options: Any
) -> Path:
    """`rows` replayed across `engines` engines of 20 blocks of 4 behind `router`."""
    trace = directory / "trace.jsonl"
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = directory / f"{router}-{engines}-{len(list(directory.iterdir()))}.duckdb"
    settings = CacheSettings(4, 20)
    replay(
        trace,
        out,
        ReplayOptions(
            settings=settings, timing="sequential", engines=engines, router=router, **options
        ),
        SECRET,
    )
    return out


def judge(run: Path) -> Any:
    with RunFile.open(run) as run_file:
        return routing(RunContext(run_file, run))


def ratio_of(run: Path) -> float:
    with RunFile.open(run) as run_file:
        return float(run_summary(run_file)["token_hit_ratio"])


def test_prefix_affinity_ahead_fires_with_the_replayed_ratios(tmp_path: Path) -> None:
    run = fleet_run(tmp_path, family_trace(), "round-robin", record_token_ids=True)
    (suggestion,) = judge(run)
    # Independent fleet replays of the same trace behind each router.
    round_robin = ratio_of(fleet_run(tmp_path, family_trace(), "round-robin"))
    affinity = ratio_of(fleet_run(tmp_path, family_trace(), "prefix-affinity"))
    assert (round_robin, affinity) == (32 / 96, 48 / 96)  # tests/test_fleet_replay.py by hand
    figures = suggestion.figures
    assert figures["round_robin_token_hit_ratio"] == round_robin
    assert figures["prefix_affinity_token_hit_ratio"] == affinity
    assert figures["measured_token_hit_ratio"] == round_robin  # the run was round-robin
    # Four requests an engine either way: A A B B A A B B splits evenly under both.
    assert figures["round_robin_busiest_requests"] == figures["prefix_affinity_busiest_requests"]
    assert figures["prefix_affinity_busiest_requests"] == 4
    assert figures["round_robin_busiest_over_mean"] == 1.0
    assert figures["prefix_affinity_busiest_over_mean"] == 1.0
    # Round-robin caches both families' two prefix blocks on both engines: 4 extra copies.
    gib_per_block = gib_for_blocks(MODELS["llama-3.1-8b"], 4, 1)  # RunContext's default spec
    assert figures["peak_duplicated_blocks"] == 4
    assert figures["peak_duplicated_gib"] == 4 * gib_per_block
    assert suggestion.rule == "routing"
    assert suggestion.severity == "high"  # 16.7 points
    assert suggestion.gain_tokens == pytest.approx(16)
    assert suggestion.title == "Prefix-aware routing would win 16.7 points over round-robin"
    assert suggestion.evidence[0].endswith(
        "round-robin 33.3% token hit ratio, prefix-affinity 50.0%"
    )
    assert suggestion.evidence[3].endswith("routing by prefix makes no hot spot here")
    assert "llm-d" in suggestion.action and "Dynamo" in suggestion.action


def test_one_engine_is_not_applicable(tmp_path: Path) -> None:
    run = fleet_run(tmp_path, family_trace(), "round-robin", engines=1, record_token_ids=True)
    with pytest.raises(NotApplicable, match="one engine: routing does not apply"):
        judge(run)


def test_a_fleet_without_recorded_prompts_is_not_applicable(tmp_path: Path) -> None:
    run = fleet_run(tmp_path, family_trace(), "round-robin")
    with pytest.raises(NotApplicable, match="--record-token-ids"):
        judge(run)


def test_prompts_sharing_nothing_leave_nothing_to_win(tmp_path: Path) -> None:
    run = fleet_run(tmp_path, distinct_trace(), "round-robin", record_token_ids=True)
    with pytest.raises(NothingToWin) as found:
        judge(run)
    assert str(found.value) == (
        "replayed across 2 engines of 20 blocks, prefix-affinity routing hits 0.0% of prompt "
        "tokens and round-robin 0.0%: 0.0 points (under 2), so where a request lands barely "
        "changes what it hits"
    )
