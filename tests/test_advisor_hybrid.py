"""The hybrid-alignment rule: hits cut short by a sliding-window group, weighed against
vLLM's hybrid KV cache manager off (every layer one full-attention group, in the same
memory), on the hybrid sample and on replays of the sample trace through vLLM's manager."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from collector.advisor import RULES, RunContext, Suggestion, advise
from collector.model.block_stream import trace_block_stream
from collector.model.mrc import miss_ratio_curve
from collector.queries.miss_causes import cause_totals
from collector.replay.block_manager import CacheSettings
from collector.replay.replayer import ReplayOptions, replay_requests
from collector.replay.traces import read_trace
from collector.store.run_file import RunFile
from tests.support.repo import SAMPLE_HYBRID_RUN, SAMPLE_RUN, SAMPLE_TRACE, SECRET
from tests.test_advisor_causes import LINE, quoted

pytestmark = pytest.mark.vllm

HYBRID = (("hybrid-alignment", dict(RULES)["hybrid-alignment"]),)


def judged(run: Path) -> tuple[str, list[Suggestion], str]:
    with RunFile.open(run) as run_file:
        advice = advise(RunContext(run_file, run), HYBRID)
    (check,) = advice.checks
    return check.status, advice.suggestions, check.detail


def group_cut(run: Path) -> int:
    with RunFile.open(run) as run_file:
        return int(cause_totals(run_file).set_index("cause")["tokens"].get("group_cut", 0))


def hybrid_replay(
    tmp_path: Path, num_blocks: int, *, record_token_ids: bool = False, salted: bool = False
) -> Path:
    """The sample trace's first 150 requests, one at a time, as gpt-oss's two groups hold
    them (full attention, a 128-token window) in `num_blocks`; each under a cache salt of
    its own with `salted` (so none shares a block)."""
    out = tmp_path / f"hybrid-{num_blocks}{'-salted' if salted else ''}.duckdb"
    requests = read_trace(SAMPLE_TRACE, limit=150)
    if salted:
        requests = [
            dataclasses.replace(request, cache_salt=f"user-{index}")
            for index, request in enumerate(requests)
        ]
    settings = CacheSettings(16, num_blocks, kv_layout="gpt-oss")
    options = ReplayOptions(settings=settings, record_token_ids=record_token_ids)
    replay_requests(requests, SAMPLE_TRACE, out, options, SECRET)
    return out


def test_the_hybrid_sample_weighs_the_cut_hits_against_half_the_blocks() -> None:
    status, (suggestion,), _ = judged(SAMPLE_HYBRID_RUN)
    assert status == "fired" and suggestion.rule == "hybrid-alignment"
    figures = suggestion.figures
    # Two groups of one layer each: every layer in one group takes blocks twice as large.
    assert figures["num_groups"] == 2 and figures["all_full_attention_num_blocks"] == 750
    assert figures["replayed"] is False  # the sample recorded no prompts: the curve weighs it
    # The quote is the breakdown's: 35,680 prompt tokens cut short (`kvscope explain`).
    assert (
        figures["miss_causes"]
        == {"group_cut": 35_680}
        == {"group_cut": group_cut(SAMPLE_HYBRID_RUN)}
    )
    assert quoted(suggestion) == [
        LINE + "35,680 (7.2%) missed as cut short by another KV cache group"
    ]
    assert figures["own_groups_token_hit_ratio"] == pytest.approx(224_800 / 495_226)
    assert "--disable-hybrid-kv-cache-manager" in suggestion.action
    assert suggestion.gain_tokens == pytest.approx(
        (figures["predicted_token_hit_ratio"] - figures["own_groups_token_hit_ratio"]) * 495_226
    )


def test_with_its_prompts_a_run_is_replayed_both_ways_through_vllms_manager(
    tmp_path: Path,
) -> None:
    run = hybrid_replay(tmp_path, 2000, record_token_ids=True)
    status, (suggestion,), _ = judged(run)
    figures = suggestion.figures
    assert status == "fired" and figures["replayed"] is True
    assert figures["all_full_attention_num_blocks"] == 1000
    with RunFile.open(run) as run_file:
        context = RunContext(run_file, run)
        hit_tokens, prompt_tokens = context.summary["hit_tokens"], context.prompt_tokens
        requests = context.requests
    # The run was itself replayed one request at a time: replaying its own groups again
    # hits exactly what it hit.
    assert figures["own_groups_token_hit_ratio"] == hit_tokens / prompt_tokens
    # All full attention, one request at a time, is what the one-pass curve computes exactly.
    curve = miss_ratio_curve(trace_block_stream(requests, 16), 16)
    assert figures["predicted_token_hit_ratio"] == curve.hits_at(1000) * 16 / prompt_tokens
    assert figures["miss_causes"] == {"group_cut": group_cut(run)}
    assert "replayed one at a time through vLLM's manager" in suggestion.evidence[-1]


def test_a_window_in_a_roomy_pool_still_cuts_hits_and_one_group_suggests_nothing(
    tmp_path: Path,
) -> None:
    # Room for every block of the 150 requests: nothing is evicted, yet vLLM's window group
    # never allocated the blocks its window had passed, so later prefixes find them missing.
    roomy = hybrid_replay(tmp_path, 20_000)
    status, (suggestion,), _ = judged(roomy)
    with RunFile.open(roomy) as run_file:
        assert RunContext(run_file, roomy).summary["evictions"] == 0
    assert status == "fired" and suggestion.figures["miss_causes"]["group_cut"] > 0
    # Salted apart, no request shares a block: nothing is cut, and the rule says so.
    salted = hybrid_replay(tmp_path, 2000, salted=True)
    status, suggestions, detail = judged(salted)
    assert (status, suggestions) == ("silent", [])
    assert (
        detail == "hits cut short by another KV cache group lost 0 prompt tokens (0.0%), under 1%"
    )
    status, suggestions, detail = judged(SAMPLE_RUN)
    assert (status, suggestions) == ("skipped", [])
    assert detail == "one KV cache group: no group can cut another's hit short"
