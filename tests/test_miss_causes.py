"""Why each lookup missed (collector/queries/miss_causes.py): hand-built traces, replayed
through vLLM's real KV cache manager (and scheduler), whose breakdown is worked out by hand,
one cause each and one mixing them; and on every sample run, the causes add up to the
prompt tokens exactly and the hits to vLLM's own `prefix_cache_hits`.

Block size 4 unless said: a lookup serves at most (P - 1) // 4 full blocks of a P-token
prompt, and the rest is its `partial_block` (4 tokens for a 12- or 8-token prompt).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from collector.queries.miss_causes import CAUSES, cause_totals, lookup_causes
from collector.replay.block_manager import CacheSettings, make_block_hasher, make_kv_cache_manager
from collector.replay.replayer import ReplayOptions, replay
from collector.replay.simulator import Simulator, VirtualClock
from collector.replay.traces import read_trace
from collector.store.run_file import RunConfig, RunFile, RunStore
from engine_hooks import EventBuffer, KVCacheHooks, Pseudonymizer
from tests.support.block_manager import tiny_run
from tests.support.fleet import family_trace
from tests.support.repo import REPO, SECRET
from tests.support.runs import EVICTIONS, evictions_run

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version

Breakdown = dict[str, dict[str, int]]


def breakdown(run_path: Path) -> Breakdown:
    """Per request, its tokens per cause (over its lookups)."""
    with RunFile.open(run_path) as run:
        causes = lookup_causes(run)
    result: Breakdown = {}
    for row in causes.itertuples():
        tokens = result.setdefault(str(row.request_id), {})
        tokens[str(row.cause)] = tokens.get(str(row.cause), 0) + int(row.tokens)
    return result


def details(run_path: Path, request: str, cause: str) -> dict[str, Any]:
    """The details of a request's (first) row of that cause."""
    with RunFile.open(run_path) as run:
        causes = lookup_causes(run, request)
    (row,) = causes[causes["cause"] == cause].head(1).to_dict("records")
    return row


def rows_of(requests: list[tuple[str, list[int], dict[str, Any]]]) -> list[dict[str, Any]]:
    """Trace rows 10 ms apart, no output."""
    return [
        {"request_id": request, "timestamp": 10 * index, "token_ids": tokens, "output_length": 0}
        | extra
        for index, (request, tokens, extra) in enumerate(requests)
    ]


def test_a_salt_per_request_is_a_key_mismatch_and_a_first_prompt_is_cold(tmp_path: Path) -> None:
    prompt = list(range(1, 13))  # 12 tokens: blocks 0 and 1 can hit, 4 tokens partial
    rows = rows_of([("s0", prompt, {"cache_salt": "x"}), ("s1", prompt, {"cache_salt": "y"})])
    run = tiny_run(tmp_path, rows, block_size=4, num_blocks=20, record_token_ids=True)
    assert breakdown(run) == {
        "s0": {"cold": 8, "partial_block": 4},
        "s1": {"key_mismatch": 8, "partial_block": 4},
    }
    assert details(run, "s1", "key_mismatch")["key_kind"] == "cache_salt"


def test_without_token_ids_the_fingerprints_tell_the_key_mismatch(tmp_path: Path) -> None:
    """The hooks' key-free fingerprints (on by default) tell the same causes as recorded
    token ids, in a run that keeps no token ids."""
    prompt = list(range(1, 13))
    rows = rows_of([("s0", prompt, {"cache_salt": "x"}), ("s1", prompt, {"cache_salt": "y"})])
    (tmp_path / "ids").mkdir()
    with_ids = tiny_run(tmp_path / "ids", rows, block_size=4, num_blocks=20, record_token_ids=True)
    run = tiny_run(tmp_path, rows, block_size=4, num_blocks=20)
    with RunFile.open(run) as opened:
        assert opened.frame("SELECT count(*) AS n FROM request_tokens")["n"][0] == 0
    assert (
        breakdown(run)
        == breakdown(with_ids)
        == {
            "s0": {"cold": 8, "partial_block": 4},
            "s1": {"key_mismatch": 8, "partial_block": 4},
        }
    )
    assert details(run, "s1", "key_mismatch")["key_kind"] == "cache_salt"


def test_without_token_ids_nor_fingerprints_new_blocks_are_unexplained(tmp_path: Path) -> None:
    """A key mismatch looks like a new prefix when neither token ids nor key-free
    fingerprints were recorded (KVSCOPE_CHECK_COLLISIONS=0, replay --no-check-collisions)."""
    prompt = list(range(1, 13))
    rows = rows_of([("s0", prompt, {"cache_salt": "x"}), ("s1", prompt, {"cache_salt": "y"})])
    run = tiny_run(tmp_path, rows, block_size=4, num_blocks=20, check_collisions=False)
    assert breakdown(run) == {
        "s0": {"unexplained": 8, "partial_block": 4},
        "s1": {"unexplained": 8, "partial_block": 4},
    }
    assert details(run, "s1", "unexplained")["reason"] == "no_token_ids"


def test_another_lora_adapter_is_a_key_mismatch(tmp_path: Path) -> None:
    prompt = list(range(1, 13))
    rows = rows_of([("l0", prompt, {"lora": "alpha"}), ("l1", prompt, {"lora": "beta"})])
    run = tiny_run(tmp_path, rows, block_size=4, num_blocks=20, record_token_ids=True)
    assert breakdown(run) == {
        "l0": {"cold": 8, "partial_block": 4},
        "l1": {"key_mismatch": 8, "partial_block": 4},
    }
    assert details(run, "l1", "key_mismatch")["key_kind"] == "lora"


def test_a_capacity_eviction_names_who_evicted_it_and_when(tmp_path: Path) -> None:
    """tests/support/runs.py EVICTIONS: z0 (tenant y) evicts X1 and X2 at 20 ms; x1 comes
    back for X1 at 30 ms (its 8 tokens: one block can hit, 4 tokens partial)."""
    run = evictions_run(tmp_path)
    assert [row["request_id"] for row in EVICTIONS] == ["x0", "y0", "z0", "x1"]
    assert breakdown(run) == {
        "x0": {"cold": 4, "partial_block": 4},
        "y0": {"cold": 8, "partial_block": 4},
        "z0": {"cold": 8, "partial_block": 4},
        "x1": {"evicted": 4, "partial_block": 4},
    }
    evicted = details(run, "x1", "evicted")
    assert (evicted["evicted_by"], evicted["evicted_by_tenant"]) == ("z0", "y")
    assert evicted["evicted_ago_ns"] == 10_000_000
    with RunFile.open(run) as run_file:
        (z_root,) = run_file.row(
            "SELECT block_hash FROM events WHERE kind = 'store' AND request_id = 'z0' "
            "AND block_position = 0"
        ) or (None,)
    assert evicted["evicted_by_family"] == z_root


def test_a_timestamp_inside_the_prompt_diverges_from_there_on(tmp_path: Path) -> None:
    """16 tokens: a shared first block, a block with a timestamp, two shared blocks after.
    d1 hits block 0; its block 1 differs from d0's (the same parent, other tokens): diverged,
    and block 2 follows it (its hash is new because its parent's is); block 3 is partial."""
    head, tail = [1, 2, 3, 4], list(range(9, 17))
    rows = rows_of(
        [
            ("d0", [*head, 5, 6, 7, 8, *tail], {}),
            ("d1", [*head, 55, 66, 77, 88, *tail], {}),
            ("d2", [*head, 5, 6, 7, 8, *tail], {}),
        ]
    )
    run = tiny_run(tmp_path, rows, block_size=4, num_blocks=20)
    assert breakdown(run) == {
        "d0": {"cold": 12, "partial_block": 4},
        "d1": {"hit": 4, "diverged": 8, "partial_block": 4},
        "d2": {"hit": 12, "partial_block": 4},
    }


def test_a_partial_tail_is_never_served(tmp_path: Path) -> None:
    """10 tokens: two full blocks (the second one hit-eligible: (10 - 1) // 4 = 2) and a
    2-token tail."""
    rows = rows_of([("p0", list(range(1, 11)), {}), ("p1", list(range(1, 11)), {})])
    run = tiny_run(tmp_path, rows, block_size=4, num_blocks=20)
    assert breakdown(run) == {
        "p0": {"cold": 8, "partial_block": 2},
        "p1": {"hit": 8, "partial_block": 2},
    }


def hooked_run(path: Path, parts: list[list[dict[str, Any]]], reset: bool) -> Path:
    """The parts of a trace through vLLM's manager with kvscope's hooks, one request at a
    time, with vLLM's `reset_prefix_cache` between parts when `reset`; stored as a run."""
    settings = CacheSettings(4, 20)
    manager = make_kv_cache_manager(settings)
    buffer, clock = EventBuffer(), VirtualClock()
    hooks = KVCacheHooks(manager, buffer, pseudonymizer=Pseudonymizer(SECRET), clock=clock)
    simulator = Simulator(manager, hooks.attach(), clock, make_block_hasher(settings), lambda: None)
    first = 0
    for number, part in enumerate(parts):
        trace = path.with_suffix(f".{number}.jsonl")
        trace.write_text("".join(json.dumps(row) + "\n" for row in part))
        if number and reset:
            assert manager.reset_prefix_cache()
        simulator.run_sequential(read_trace(trace), lambda _: None, first)
        first += len(part)
    hooks.detach()
    store = RunStore.create(path, RunConfig("test", 4, 20, "sha256", "test"))
    store.append(buffer.take())
    store.finalize()
    store.close()
    return path


def test_a_cache_reset_clears_what_the_next_request_needed(tmp_path: Path) -> None:
    first = rows_of([("r0", list(range(1, 9)), {})])
    again = [{**row, "request_id": "r1", "timestamp": 10} for row in first]
    run = hooked_run(tmp_path / "run.duckdb", [first, again], reset=True)
    assert breakdown(run) == {
        "r0": {"cold": 4, "partial_block": 4},
        "r1": {"cleared": 4, "partial_block": 4},
    }
    without = hooked_run(tmp_path / "kept.duckdb", [first, again], reset=False)
    assert breakdown(without)["r1"] == {"hit": 4, "partial_block": 4}


def test_a_preempted_request_finds_its_own_blocks_evicted(tmp_path: Path) -> None:
    """Scheduler timing, 8 usable blocks: q0 and q1 (12 tokens, 12 outputs each) run side
    by side; q1 is preempted after storing 4 blocks (its prompt and its first output
    block), and q0's decode takes two of them (q1's blocks 2 and 3). Resumed, q1 looks up
    its 12 prompt and 5 output tokens: blocks 0 and 1 hit, blocks 2 and 3 its own blocks
    lost to the preemption, 1 token partial."""
    rows = [
        {"request_id": "q0", "timestamp": 0, "token_ids": list(range(1, 13)), "output_length": 12},
        {
            "request_id": "q1",
            "timestamp": 0,
            "token_ids": list(range(101, 113)),
            "output_length": 12,
        },
    ]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "run.duckdb"
    replay(trace, out, ReplayOptions(settings=CacheSettings(4, 9), timing="scheduler"), SECRET)
    with RunFile.open(out) as run:
        causes = lookup_causes(run, "q1")
    by_lookup = {
        bool(preempted): dict(zip(group["cause"], group["tokens"], strict=True))
        for preempted, group in causes.groupby("preempted")
    }
    assert by_lookup == {
        False: {"cold": 8, "partial_block": 4},
        True: {"hit": 8, "preempted": 8, "partial_block": 1},
    }
    assert details(out, "q1", "preempted")["evicted_by"] == "q0"
    assert breakdown(out)["q0"] == {"cold": 8, "partial_block": 4}


def test_a_fleet_routed_round_robin_misses_what_the_other_engine_holds(tmp_path: Path) -> None:
    """tests/support/fleet.py: A A B B A A B B over two engines, round-robin: engine-0 gets
    A0 B2 A4 B6, engine-1 A1 B3 A5 B7. Each prompt is its family's two blocks and one of its
    own (the partial block: 12 tokens). A0 and B2 are cold; A1 and B3 find their family on
    the other engine; the rest hit their family's 8 tokens."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(row) + "\n" for row in family_trace()))
    out = tmp_path / "run.duckdb"
    options = ReplayOptions(settings=CacheSettings(4, 20), engines=2, router="round-robin")
    replay(trace, out, options, SECRET)
    got = breakdown(out)
    assert got == {
        "A0": {"cold": 8, "partial_block": 4},
        "A1": {"other_engine": 8, "partial_block": 4},
        "B2": {"cold": 8, "partial_block": 4},
        "B3": {"other_engine": 8, "partial_block": 4},
        **{request: {"hit": 8, "partial_block": 4} for request in ("A4", "A5", "B6", "B7")},
    }
    assert details(out, "A1", "other_engine")["other_engine"] == "engine-0"


def test_a_hybrid_window_group_cuts_the_hit_short(tmp_path: Path) -> None:
    """Full attention beside a 32-token sliding window, block size 16 (tests/test_hybrid_
    layouts.py): the second 120-token prompt of a 100-token prefix reuses nothing, where full
    attention alone held 96 tokens (the window group had kept only the first prompt's last
    blocks): 96 tokens cut short; its block 6 (tokens 96-111) differs from the first
    prompt's: diverged; 8 tokens partial."""
    prefix = list(range(100))
    rows = rows_of([("h0", [*prefix, *[1000] * 20], {}), ("h1", [*prefix, *[2000] * 20], {})])
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "run.duckdb"
    settings = CacheSettings(16, 40, kv_layout="full,sliding_window:32")
    replay(trace, out, ReplayOptions(settings=settings), SECRET)
    assert breakdown(out) == {
        "h0": {"cold": 112, "partial_block": 8},
        "h1": {"group_cut": 96, "diverged": 16, "partial_block": 8},
    }


def test_one_trace_mixing_the_causes(tmp_path: Path) -> None:
    """Six usable blocks. m0 stores A (8 tokens of a 12-token prompt); m1 shares A's first
    block then diverges; m2 is salted (token ids recorded: a key mismatch on A's tokens);
    m3 and m4, 24 tokens each of their own, take every free block (m3 takes A's); m5 comes
    back for A: its first block was evicted by m3 or m4 (the older first)."""
    a = list(range(1, 13))
    rows = rows_of(
        [
            ("m0", a, {}),
            ("m1", [1, 2, 3, 4, 50, 60, 70, 80, 9, 10, 11, 12], {}),
            ("m2", a, {"cache_salt": "pepper"}),
            ("m3", list(range(301, 325)), {}),
            ("m4", list(range(401, 425)), {}),
            ("m5", a, {}),
        ]
    )
    run = tiny_run(tmp_path, rows, block_size=4, num_blocks=7, record_token_ids=True)
    got = breakdown(run)
    assert got == {
        "m0": {"cold": 8, "partial_block": 4},
        "m1": {"hit": 4, "diverged": 4, "partial_block": 4},
        "m2": {"key_mismatch": 8, "partial_block": 4},
        "m3": {"cold": 20, "partial_block": 4},
        "m4": {"cold": 20, "partial_block": 4},
        "m5": {"evicted": 8, "partial_block": 4},
    }
    assert details(run, "m5", "evicted")["evicted_by"] in ("m3", "m4")


SAMPLES = sorted((REPO / "sample_data").glob("*.duckdb"))


@pytest.mark.parametrize("sample", SAMPLES, ids=[path.stem for path in SAMPLES])
def test_on_every_sample_the_causes_add_up_and_the_hits_are_vllms(sample: Path) -> None:
    with RunFile.open(sample) as run:
        causes = lookup_causes(run)
        totals = cause_totals(run)
        looked_up, first_hits = run.row(
            "SELECT sum(num_prompt_tokens), sum(num_hit_tokens) FILTER (WHERE NOT preempted) "
            "FROM events WHERE kind = 'lookup'"
        ) or (0, 0)
        (vllm_hits,) = run.row("SELECT vllm_prefix_cache_hits FROM runs") or (None,)
        lookups = run.row("SELECT count(*) FROM events WHERE kind = 'lookup'")
    assert set(causes["cause"]) <= set(CAUSES)
    assert int(causes["tokens"].sum()) == int(totals["tokens"].sum()) == looked_up
    per_lookup = causes.groupby(["engine", "rank", "seq"])["tokens"].sum()
    assert len(per_lookup) == (lookups or (0,))[0]
    first = causes[(causes["cause"] == "hit") & ~causes["preempted"]]
    assert int(first["tokens"].sum()) == first_hits == vllm_hits
    assert totals["share"].sum() == pytest.approx(1.0)
