"""`--timing scheduler`: a replay through vLLM's own Scheduler, checked against a real vLLM
engine request by request, and with the hooks attached as the engine plugin attaches them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from collector.live.step_cost import fit_step_model
from collector.model.step_model import StepModel
from collector.replay.block_manager import CacheSettings, make_block_hasher
from collector.replay.scheduler_replay import SchedulerLimits, SchedulerReplay
from collector.replay.simulator import VirtualClock
from collector.replay.traces import read_trace
from engine_hooks import EventBuffer, KVCacheHooks, Pseudonymizer
from engine_hooks.events import Lookup, Schedule
from tests.support.burst_engine import (
    BURST_MAX_NUM_BATCHED_TOKENS,
    agreement,
    burst_rows,
    replayed_hits,
    run_burst,
    run_timed,
)
from tests.support.vllm_server import build_model


@pytest.mark.slow  # a real engine on this CPU
def test_a_burst_matches_the_real_engine_request_by_request(tmp_path: Path) -> None:
    model = build_model(tmp_path / "model")
    rows = run_burst(model, burst_rows(5, 96), tmp_path / "trace.jsonl")
    engine = {row["request_id"]: row["engine_cached_tokens"] for row in rows}
    scheduler = replayed_hits(tmp_path / "trace.jsonl", tmp_path / "scheduler.duckdb", "scheduler")
    steps = replayed_hits(tmp_path / "trace.jsonl", tmp_path / "steps.duckdb", "timestamps")
    print(agreement("step model", engine, steps, sum(len(row["token_ids"]) for row in rows)))
    # The pool is small and prefills are chunked (256 tokens a step): every request's hit is
    # the engine's, exactly.
    assert scheduler == engine
    assert sum(engine.values()) > 0


@pytest.mark.slow  # a real vLLM OpenAI server on this CPU
def test_timed_arrivals_agree_with_the_real_server_in_aggregate(tmp_path: Path) -> None:
    # 60 requests 300 ms apart through the OpenAI server, 1 to 60 output tokens each. Where
    # requests overlap, how long the server's steps take decides how they meet in the pool:
    # `kvscope calibrate` measures that on the same server first, and the replay's clock
    # takes it. With the default cost model (10 ms a step, made for no engine in particular)
    # the aggregate came out 0.013 apart here (0.3265 against 0.3396), one request differing.
    model = build_model(tmp_path / "model")
    rows = [row | {"timestamp": index * 300} for index, row in enumerate(burst_rows(7, 60))]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    engine, measured = run_timed(model, rows, tmp_path / "vllm.log")
    calibrated = fit_step_model(measured, BURST_MAX_NUM_BATCHED_TOKENS)
    print(f"measured on the server: {measured}; step cost: {calibrated}")
    prompt_tokens = sum(len(row["token_ids"]) for row in rows)
    engine_ratio = sum(engine.values()) / prompt_tokens
    replays = {
        "scheduler, calibrated": replayed_hits(
            trace, tmp_path / "calibrated.duckdb", "scheduler", calibrated
        ),
        "scheduler, default cost": replayed_hits(trace, tmp_path / "default.duckdb", "scheduler"),
        "step model": replayed_hits(trace, tmp_path / "steps.duckdb", "timestamps"),
    }
    for name, replayed in replays.items():
        print(agreement(name, engine, replayed, prompt_tokens))
    scheduler = replays["scheduler, calibrated"]
    # Where two requests meet within a step, a busy machine decides the race: in one CI run
    # on a loaded machine the calibrated replay gave r39 224 hit tokens against the engine's
    # 64 (0.3506 against 0.3396), every other request equal. So: at most two requests of 60
    # differ, and the aggregate stays within what two such races move it.
    differing = [key for key in engine if scheduler.get(key) != engine[key]]
    assert len(differing) <= 2, differing
    assert sum(scheduler.values()) / prompt_tokens == pytest.approx(engine_ratio, abs=0.025)
    assert engine_ratio > 0


def prompt_rows(prompts: list[list[int]], output_length: int) -> list[dict[str, Any]]:
    return [
        {
            "request_id": f"r{index}",
            "timestamp": 0,
            "token_ids": tokens,
            "output_length": output_length,
        }
        for index, tokens in enumerate(prompts)
    ]


def scheduler_replay(
    tmp_path: Path, rows: list[dict[str, Any]], budget: int, hooked: bool
) -> tuple[SchedulerReplay, EventBuffer]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    settings = CacheSettings(16, 64)
    buffer = EventBuffer()
    clock = VirtualClock()
    replay = SchedulerReplay(
        settings,
        SchedulerLimits(max_num_seqs=4, max_num_batched_tokens=budget),
        step_model=StepModel(),
        block_hasher=make_block_hasher(settings),
        clock=clock,
        on_step=lambda: None,
    )

    def hooks(scheduler: Any) -> KVCacheHooks:
        return KVCacheHooks(
            scheduler.kv_cache_manager, buffer, pseudonymizer=Pseudonymizer(b"k"), clock=clock
        )

    replay.run(read_trace(trace), lambda _: None, hooks=hooks if hooked else None)
    return replay, buffer


@pytest.mark.vllm
def test_prefills_are_chunked_to_the_token_budget(tmp_path: Path) -> None:
    # Two 100-token prompts sharing 64 tokens, 32 tokens a step: the first takes 4 steps of
    # prefill; the second, admitted in the step the first's last chunk leaves room in, hits
    # the 4 shared blocks the first cached by then.
    shared = list(range(1_000, 1_064))
    rows = prompt_rows([shared + list(range(2_000, 2_036)), shared + list(range(3_000, 3_036))], 4)
    replay, buffer = scheduler_replay(tmp_path, rows, budget=32, hooked=True)
    records = buffer.take()
    lookups = {r.request_id: r.num_hit_tokens for r in records if isinstance(r, Lookup)}
    assert lookups == {"r0": 0, "r1": 64}
    assert [r.request_id for r in records if isinstance(r, Schedule)] == ["r0", "r1"]
    # vLLM's own counters agree with the hooks' lookups.
    assert (replay.prefix_cache_queries, replay.prefix_cache_hits) == (200, 64)
    # r0: 4 prefill steps (32, 32, 32, 4); r1: 36 tokens after its hit, 2 steps; then decoding.
    assert replay.steps > 4


@pytest.mark.vllm
def test_the_hooks_change_nothing_the_scheduler_does(tmp_path: Path) -> None:
    rows = [row | {"timestamp": index * 5} for index, row in enumerate(burst_rows(3, 40))]
    for row in rows:
        row["token_ids"] = row["token_ids"][:300]
    bare, _ = scheduler_replay(tmp_path / "bare", rows, budget=128, hooked=False)
    hooked, buffer = scheduler_replay(tmp_path / "hooked", rows, budget=128, hooked=True)
    assert (bare.steps, bare.prefix_cache_queries, bare.prefix_cache_hits) == (
        hooked.steps,
        hooked.prefix_cache_queries,
        hooked.prefix_cache_hits,
    )
    assert bare.prefix_cache_hits > 0
    hits = sum(r.num_hit_tokens for r in buffer.take() if isinstance(r, Lookup) and not r.preempted)
    assert hits == hooked.prefix_cache_hits
