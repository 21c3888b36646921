"""Each advisor rule fires on a small trace made to trigger it and stays silent on its control."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from collector.advisor import RULES, RunContext, Suggestion, advise
from collector.advisor.cache_size import SizeSource, phrase_source, recommend_size
from collector.advisor.ranking import merge_same_flag, rank
from collector.advisor.suggestion import SEVERITIES
from collector.replay.sweep_results import SweepResult
from collector.store.run_file import RunConfig, RunFile, RunStore
from engine_hooks.events import Arrive
from tests.support.block_manager import tiny_run
from tests.support.sweeps import sweep_result

Rows = list[dict[str, Any]]


def tokens(seed: int, count: int) -> list[int]:
    generator = random.Random(seed)
    return [generator.randrange(1_000, 30_000) for _ in range(count)]


def judge(
    run: Path, rule: str, max_model_len: int | None = None
) -> tuple[str, list[Suggestion], str]:
    """What one rule says about a run: its status, its suggestions, its detail."""
    chosen = tuple(entry for entry in RULES if entry[0] == rule)
    with RunFile.open(run) as run_file:
        advice = advise(RunContext(run_file, run, max_model_len=max_model_len), chosen)
    (check,) = advice.checks
    for suggestion in advice.suggestions:
        assert suggestion.severity in SEVERITIES
        assert suggestion.evidence and suggestion.effect and suggestion.action
    return check.status, advice.suggestions, check.detail


def run_of(tmp_path: Path, name: str, rows: Rows, **options: Any) -> Path:
    directory = tmp_path / name
    directory.mkdir()
    return tiny_run(directory, rows, **options)


# -- pool pressure ---------------------------------------------------------------------


def burst_rows() -> Rows:
    """Twelve long-decoding requests at once: the running requests hold most blocks."""
    return [
        {
            "request_id": f"r{index}",
            "timestamp": 0,
            "token_ids": tokens(index, 12),
            "output_length": 60,
        }
        for index in range(12)
    ]


def test_low_free_blocks(tmp_path: Path) -> None:
    options = {"timing": "timestamps", "max_num_seqs": 8}
    tight = run_of(tmp_path, "tight", burst_rows(), num_blocks=40, **options)
    status, (suggestion,), _ = judge(tight, "low-free-blocks")
    assert status == "fired"
    assert suggestion.figures["share_under_alarm"] >= 0.05
    assert "--num-gpu-blocks-override" in suggestion.action
    assert "--max-num-seqs 4" in suggestion.action
    roomy = run_of(tmp_path, "roomy", burst_rows(), num_blocks=400, **options)
    assert judge(roomy, "low-free-blocks")[0] == "silent"


def cyclic_rows(num_prompts: int, rounds: int) -> Rows:
    """Prompts of 9 tokens (two full blocks of 4) sent round-robin, one at a time."""
    prompts = [tokens(100 + number, 9) for number in range(num_prompts)]
    return [
        {
            "request_id": f"r{index}",
            "timestamp": index,
            "token_ids": prompts[index % num_prompts],
            "output_length": 0,
        }
        for index in range(num_prompts * rounds)
    ]


def test_eviction_regret(tmp_path: Path) -> None:
    # Four prompts of three blocks each cycle through six usable blocks: LRU keeps nothing.
    thrashing = run_of(tmp_path, "thrashing", cyclic_rows(4, 8), num_blocks=7)
    status, (suggestion,), _ = judge(thrashing, "eviction-regret")
    assert status == "fired"
    assert suggestion.figures["regret_ratio"] > 0.9
    assert "median" in suggestion.evidence[1]
    assert [chart.kind for chart in suggestion.charts] == ["bar", "bar"]
    # The same number of evictions, but every prompt is new: nothing comes back.
    unique = run_of(tmp_path, "unique", cyclic_rows(32, 1), num_blocks=7)
    assert judge(unique, "eviction-regret")[0] == "silent"


def test_cache_size(tmp_path: Path) -> None:
    thrashing = run_of(tmp_path, "thrashing", cyclic_rows(4, 8), num_blocks=7)
    status, (grow,), _ = judge(thrashing, "cache-size")
    assert status == "fired"
    # Four prompts of two cacheable blocks, plus room for the running request's partial one.
    assert grow.figures["recommended_num_blocks"] == 10
    # The 7 blocks' memory holds 14 in fp8: the other knob, offered beside the block count.
    assert grow.action == (
        "`--num-gpu-blocks-override 10` (or, in today's memory: --kv-cache-dtype fp8 holds "
        "14 blocks there, at some risk to accuracy)"
    )
    assert grow.figures["recommended_token_hit_ratio"] > grow.figures["current_token_hit_ratio"]
    oversized = run_of(tmp_path, "oversized", cyclic_rows(4, 8), num_blocks=200)
    status, (shrink,), _ = judge(oversized, "cache-size")
    assert (status, shrink.severity, shrink.action) == (
        "fired",
        "low",
        "`--num-gpu-blocks-override 10`",
    )
    # 10 blocks of 4 tokens cannot hold one 64-token request: vLLM would not start.
    _, (short,), _ = judge(oversized, "cache-size", max_model_len=64)
    assert short.action == (
        "`--num-gpu-blocks-override 10` (too small for --max-model-len 64: vLLM refuses to "
        "start with a pool of fewer than 16 blocks; lower --max-model-len to 40 or less)"
    )
    no_reuse = run_of(tmp_path, "no_reuse", cyclic_rows(32, 1), num_blocks=6)
    assert judge(no_reuse, "cache-size")[0] == "silent"


def replays(*points: tuple[int, float]) -> list[SweepResult]:
    """A what-if sweep at block size 4: pool sizes and the token hit ratio each replay
    measured."""
    return [sweep_result(4, blocks, ratio) for blocks, ratio in points]


def test_cache_size_never_takes_a_sweeps_largest_point_for_unlimited(tmp_path: Path) -> None:
    thrashing = run_of(tmp_path, "thrashing", cyclic_rows(4, 8), num_blocks=7)
    with RunFile.open(thrashing) as run_file:
        curve_only = recommend_size(RunContext(run_file, thrashing))
        # The sweep stops at 8 blocks, short of the 10 the curve needs, and still rising.
        short = recommend_size(RunContext(run_file, thrashing, whatif=replays((7, 0.0), (8, 0.1))))
        spanning = recommend_size(
            RunContext(run_file, thrashing, whatif=replays((7, 0.0), (10, 0.6), (20, 0.6)))
        )
    # 4 prompts of 9 tokens, 8 rounds: 28 requests reuse their two full blocks (8 tokens).
    unlimited = 28 * 8 / (32 * 9)
    assert (curve_only.num_blocks, curve_only.top_ratio) == (10, unlimited)
    assert (short.num_blocks, short.ratio, short.top_ratio) == (10, unlimited, unlimited)
    assert short.source is SizeSource.CURVE
    assert short.short_sweep == (
        "the what-if sweep stops at 8 blocks (10.0%), before the curve flattens: replay "
        "10 blocks or more to check this recommendation through vLLM"
    )
    assert (spanning.num_blocks, spanning.ratio, spanning.top_ratio) == (10, 0.6, unlimited)
    assert spanning.source is SizeSource.WHATIF
    assert phrase_source(spanning) == "what-if replays through vLLM (3 pool sizes)"
    assert spanning.short_sweep == ""


# -- block size ------------------------------------------------------------------------


def family_rows(prefix_tokens: int) -> Rows:
    """Eight prefix families of `prefix_tokens` tokens, five requests each, unique tails."""
    prefixes = [tokens(200 + family, prefix_tokens) for family in range(8)]
    return [
        {
            "request_id": f"r{index}",
            "timestamp": index,
            "token_ids": prefixes[index % 8] + tokens(300 + index, 20),
            "output_length": 1,
        }
        for index in range(40)
    ]


def test_block_size(tmp_path: Path) -> None:
    options = {"block_size": 32, "num_blocks": 200, "record_token_ids": True}
    # 48 shared tokens: block size 32 reuses 32 of them, 16 (or 8) all 48.
    boundary = run_of(tmp_path, "boundary", family_rows(48), **options)
    status, (suggestion,), _ = judge(boundary, "block-size")
    assert status == "fired"
    assert suggestion.figures["recommended_block_size"] == 16
    assert suggestion.action.startswith("`--block-size 16` (with `--num-gpu-blocks-override 399`")
    assert suggestion.figures["boundary_loss"] > 0.1
    aligned = run_of(tmp_path, "aligned", family_rows(64), **options)
    assert judge(aligned, "block-size")[0] == "silent"
    without_tokens = run_of(tmp_path, "without_tokens", family_rows(48), block_size=32)
    status, _, detail = judge(without_tokens, "block-size")
    assert status == "skipped"
    assert "--record-token-ids" in detail


# -- dynamic field ---------------------------------------------------------------------


def report_rows(stamped: bool, header_tokens: int = 8) -> Rows:
    header, body = tokens(400, header_tokens), tokens(401, 100)
    return [
        {
            "request_id": f"report-{index}",
            "timestamp": index,
            "token_ids": header
            + (tokens(500 + index, 10) if stamped else [])
            + body
            + tokens(600 + index, 5),
            "output_length": 2,
        }
        for index in range(12)
    ]


def test_dynamic_field(tmp_path: Path) -> None:
    options = {"num_blocks": 400, "record_token_ids": True}
    stamped = run_of(tmp_path, "stamped", report_rows(stamped=True), **options)
    status, (suggestion,), _ = judge(stamped, "dynamic-field")
    assert status == "fired"
    assert suggestion.figures == {
        "family": "report-*",
        "requests": 12,
        "field_start": 8,
        "field_tokens": 10,
        "agreement_tokens": 100,
        "tokens_per_request": 100,  # blocks 2..26 (tokens 8-107) reused as well
        # The miss breakdown: each of the 11 later requests hits the header's 2 blocks and
        # misses tokens 8-119 as diverged (28 blocks); 12 prompts of 123 tokens looked up.
        "miss_causes": {"diverged": 11 * 112},
        "cause_tokens": 11 * 112,
        "cause_share": 11 * 112 / (12 * 123),
        "family_cause_tokens": 11 * 112,
    }
    assert "differ for 10 tokens (8-17" in suggestion.evidence[0]
    assert suggestion.gain_tokens > 0
    plain = run_of(tmp_path, "plain", report_rows(stamped=False), **options)
    assert judge(plain, "dynamic-field")[0] == "silent"
    unrecorded = run_of(tmp_path, "unrecorded", report_rows(stamped=True), num_blocks=400)
    status, _, detail = judge(unrecorded, "dynamic-field")
    assert status == "skipped"
    assert "token ids" in detail


def test_dynamic_field_after_a_header_longer_than_the_window(tmp_path: Path) -> None:
    # The whole family shares windows inside its 20-token header (before the field) as well
    # as after the field: the first must not hide the second.
    rows = report_rows(stamped=True, header_tokens=20)
    run = run_of(tmp_path, "long_header", rows, num_blocks=400, record_token_ids=True)
    status, (suggestion,), _ = judge(run, "dynamic-field")
    assert status == "fired"
    assert suggestion.figures["requests"] == 12
    assert (suggestion.figures["field_start"], suggestion.figures["field_tokens"]) == (20, 10)
    assert suggestion.figures["agreement_tokens"] == 100


def test_dynamic_field_ignores_chats_that_never_agree_again(tmp_path: Path) -> None:
    system = tokens(700, 40)
    rows = [
        {
            "request_id": f"chat-{index}",
            "timestamp": index,
            "token_ids": system + tokens(800 + index, 60),
            "output_length": 1,
        }
        for index in range(12)
    ]
    run = run_of(tmp_path, "chats", rows, num_blocks=400, record_token_ids=True)
    assert judge(run, "dynamic-field")[0] == "silent"


# -- tenants, salts, hash algorithm, adapters --------------------------------------------


def tenant_rows(salt_of: Any, lora_of: Any = lambda index: None) -> Rows:
    prompt = tokens(900, 20)
    rows = []
    for index in range(10):
        row = {
            "request_id": f"r{index}",
            "timestamp": index,
            "token_ids": prompt + tokens(1_000 + index, 3),
            "output_length": 1,
            "tenant": "alpha" if index % 2 else "beta",
        }
        for field, value in (("cache_salt", salt_of(index)), ("lora", lora_of(index))):
            if value is not None:
                row[field] = value
        rows.append(row)
    return rows


def test_per_request_salt(tmp_path: Path) -> None:
    options = {"num_blocks": 100, "record_token_ids": True, "reveal_tenants": True}
    per_request = run_of(
        tmp_path, "per_request", tenant_rows(lambda index: f"salt-{index}"), **options
    )
    status, (suggestion,), _ = judge(per_request, "per-request-salt")
    assert status == "fired"
    # The miss breakdown: the 9 later requests miss the shared 20 tokens (5 blocks) under
    # another salt; 10 prompts of 23 tokens looked up.
    assert suggestion.figures == {
        "salted_requests": 10,
        "salts": 10,
        "single_use": 10,
        "miss_causes": {"key_mismatch:cache_salt": 9 * 20},
        "cause_tokens": 9 * 20,
        "cause_share": 9 * 20 / (10 * 23),
    }
    assert suggestion.gain_tokens > 0  # one salt per tenant brings reuse back
    per_tenant = run_of(
        tmp_path, "per_tenant", tenant_rows(lambda index: f"tenant-{index % 2}"), **options
    )
    assert judge(per_tenant, "per-request-salt")[0] == "silent"


def test_cross_tenant_sharing(tmp_path: Path) -> None:
    options = {"num_blocks": 100, "reveal_tenants": True}
    unsalted = run_of(tmp_path, "unsalted", tenant_rows(lambda index: None), **options)
    status, (suggestion,), _ = judge(unsalted, "cross-tenant-sharing")
    assert status == "fired"
    assert suggestion.severity == "high"
    # beta stored the 5 shared blocks first; alpha's five requests each hit all of them.
    assert suggestion.figures["cross_tenant_block_hits"] == 5 * 5
    assert "cache_salt" in suggestion.action
    per_tenant = run_of(
        tmp_path, "per_tenant", tenant_rows(lambda index: f"tenant-{index % 2}"), **options
    )
    assert judge(per_tenant, "cross-tenant-sharing")[0] == "silent"


def engine_run(path: Path, hash_algo: str, tenants: list[str]) -> Path:
    """A run file as a live engine records it (its hash algorithm is the engine's setting)."""
    config = RunConfig(
        source="engine", block_size=16, num_blocks=1_000, hash_algo=hash_algo, vllm_version="0.33.0"
    )
    store = RunStore.create(path, config)
    store.append(
        [
            Arrive(index, index * 1_000, f"r{index}", 32, tenant=tenant)
            for index, tenant in enumerate(tenants)
        ]
    )
    store.finalize()
    store.close()
    return path


def test_hash_algorithm(tmp_path: Path) -> None:
    status, (suggestion,), _ = judge(
        engine_run(tmp_path / "xxhash.duckdb", "xxhash", ["alpha", "beta"]), "hash-algorithm"
    )
    assert status == "fired"
    assert suggestion.action == "`--prefix-caching-hash-algo sha256`"
    alone = engine_run(tmp_path / "alone.duckdb", "xxhash_cbor", ["alpha", "alpha"])
    assert judge(alone, "hash-algorithm")[0] == "silent"
    secure = engine_run(tmp_path / "secure.duckdb", "sha256", ["alpha", "beta"])
    assert judge(secure, "hash-algorithm")[0] == "silent"


def test_lora_split(tmp_path: Path) -> None:
    options = {"num_blocks": 100, "record_token_ids": True}
    mixed = run_of(
        tmp_path,
        "mixed",
        tenant_rows(lambda index: None, lambda index: "sql" if index % 2 else None),
        **options,
    )
    status, (suggestion,), _ = judge(mixed, "lora-split")
    assert status == "fired"
    # The miss breakdown: the first request under the adapter misses the 20 tokens the base
    # model had cached (5 blocks); 10 prompts of 23 tokens looked up.
    assert suggestion.figures == {
        "split_blocks": 5,
        "duplicate_blocks": 5,
        "miss_causes": {"key_mismatch:lora": 20},
        "cause_tokens": 20,
        "cause_share": 20 / (10 * 23),
    }
    assert suggestion.gain_tokens == 5 * 4  # the base model's first request would have hit
    one_adapter = run_of(
        tmp_path, "one_adapter", tenant_rows(lambda index: None, lambda index: "sql"), **options
    )
    assert judge(one_adapter, "lora-split")[0] == "silent"


# -- warming ---------------------------------------------------------------------------


def bursty_rows() -> Rows:
    """Three bursts of six requests on one 8-token prefix, two seconds apart, with other
    traffic in between."""
    prefix = tokens(1_100, 8)
    rows = []
    for burst in range(3):
        start = burst * 2_000
        for index in range(6):
            rows.append(
                {
                    "request_id": f"hot-{burst}-{index}",
                    "timestamp": start + index * 10,
                    "token_ids": prefix + tokens(1_200 + burst * 10 + index, 5),
                    "output_length": 1,
                }
            )
        for index in range(6):
            rows.append(
                {
                    "request_id": f"other-{burst}-{index}",
                    "timestamp": start + 500 + index * 100,
                    "token_ids": tokens(1_300 + burst * 10 + index, 13),
                    "output_length": 1,
                }
            )
    return rows


def test_warm_prefix(tmp_path: Path) -> None:
    small = run_of(tmp_path, "small", bursty_rows(), num_blocks=13)
    status, (suggestion,), _ = judge(small, "warm-prefix")
    assert status == "fired"
    (prefix,) = suggestion.figures["prefixes"]
    assert (prefix["label"], prefix["idle_misses"], prefix["prefix_tokens"]) == ("hot-*", 2, 8)
    assert "`hot-*`: 18 requests start with this 8-token prefix" in suggestion.evidence[0]
    assert suggestion.action.startswith(
        f"while no request with prefix {prefix['block_hash']:#018x} (`hot-*`) arrives, "
        "send its first 8 tokens with `max_tokens=1` every"
    )
    large = run_of(tmp_path, "large", bursty_rows(), num_blocks=400)
    assert judge(large, "warm-prefix")[0] == "silent"


# -- cache policy ----------------------------------------------------------------------


def hot_and_scan_rows() -> Rows:
    """tests/test_policies.py's hot prompt among scans, as trace rows."""
    hot = list(range(1, 14))
    prompts: list[list[int]] = []
    for visit in range(4):
        prompts += [hot, *([100 * (2 * visit + one) + t for t in range(1, 14)] for one in (1, 2))]
    prompts.append(hot)
    return [
        {"request_id": f"r{index}", "timestamp": index, "token_ids": prompt, "output_length": 1}
        for index, prompt in enumerate(prompts)
    ]


def test_cache_policy(tmp_path: Path, monkeypatch: Any) -> None:
    # In 8 blocks LRU loses the hot prompt to the scans (0 hits); pinning its family or not
    # caching the scans keeps it: 12 hit blocks of 4 tokens in 169 prompt tokens.
    thrashing = run_of(tmp_path, "thrashing", hot_and_scan_rows(), num_blocks=8)
    status, (suggestion,), _ = judge(thrashing, "cache-policy")
    assert status == "fired"
    # Only the hot prompt's family is ever reused: the one to pin.
    assert suggestion.title == "Pinning the hottest prefix family would win 28.4 points"
    assert suggestion.figures["lru_token_hit_ratio"] == 0
    assert suggestion.figures["pin_token_hit_ratio"] == pytest.approx(48 / 169)
    assert suggestion.figures["admit_token_hit_ratio"] == pytest.approx(48 / 169)
    assert suggestion.figures["ceiling_token_hit_ratio"] == pytest.approx(48 / 169)
    assert suggestion.action.startswith("vLLM has no pinning or admission flag today")
    assert "LRU reaches 0% of it" in suggestion.evidence[3]
    # With room for everything, LRU already keeps the hot prompt: nothing to win.
    roomy = run_of(tmp_path, "roomy", hot_and_scan_rows(), num_blocks=40)
    status, _, detail = judge(roomy, "cache-policy")
    assert (status, detail) == (
        "silent",
        "LRU reaches 100% of the ceiling (28.4% against Belady's 28.4%); pinning +0.0 "
        "points, admission +0.0: this traffic leaves nothing for a cache policy to win",
    )
    # A run too large to replay in a few seconds is skipped, and says why.
    monkeypatch.setattr("collector.advisor.cache_policy.MAX_BLOCK_REFERENCES", 10)
    status, _, detail = judge(thrashing, "cache-policy")
    assert status == "skipped" and "more than the 10" in detail


def test_cpu_tier(tmp_path: Path) -> None:
    # Four prompts of two hit-eligible blocks in turn through 6 usable GPU blocks: LRU keeps
    # nothing. A tier of 2x the pool (12 blocks) holds all 8 of their blocks: the 28 requests
    # after the first round load 2 blocks each, 224 of 288 prompt tokens.
    thrashing = run_of(tmp_path, "thrashing", cyclic_rows(4, 8), num_blocks=7)
    status, (suggestion,), _ = judge(thrashing, "cpu-tier")
    assert status == "fired"
    assert suggestion.figures["lru_token_hit_ratio"] == 0
    assert suggestion.figures["tier_blocks"] == 12
    assert suggestion.figures["policy"] == "lru"
    assert suggestion.figures["tier_hit_blocks"] == 56
    assert suggestion.figures["tier_token_hit_ratio"] == pytest.approx(224 / 288)
    assert suggestion.figures["transfer_s"] < suggestion.figures["compute_s"]
    assert "--kv-offloading-size 0.0 --kv-offloading-backend native" in suggestion.action
    # Its chart: the pool alone (0 GiB), then 1x, 2x, 4x, under each of the tier's policies.
    (chart,) = suggestion.charts
    assert [series.name for series in chart.series] == ["LRU", "ARC"]
    assert chart.series[0].y[0] == 0 and chart.series[0].y[2] == pytest.approx(224 / 288)
    # Over a link this slow, moving the blocks back costs more than computing them.
    with RunFile.open(thrashing) as run_file:
        context = RunContext(run_file, thrashing, pcie_gb_per_s=0.001)
        advice = advise(context, tuple(entry for entry in RULES if entry[0] == "cpu-tier"))
    (check,) = advice.checks
    assert check.status == "silent"
    assert "takes" in check.detail and "GPU-seconds of prefill they save" in check.detail
    # With room for every prompt, the GPU pool misses nothing a tier could hold.
    roomy = run_of(tmp_path, "roomy", cyclic_rows(4, 8), num_blocks=40)
    status, _, detail = judge(roomy, "cpu-tier")
    assert status == "silent"
    assert detail.startswith("a CPU tier up to 4x the GPU pool wins at most 0.0 points")


def test_every_rule_has_a_test_here() -> None:
    tested = {
        "low-free-blocks",
        "eviction-regret",
        "cache-size",
        "block-size",
        "dynamic-field",
        "per-request-salt",
        "cross-tenant-sharing",
        "hash-algorithm",
        "lora-split",
        "warm-prefix",
        "cache-policy",
        "cpu-tier",
        "routing",  # tests/test_advisor_routing.py
        "hybrid-alignment",  # tests/test_advisor_hybrid.py
    }
    assert {name for name, _ in RULES} == tested


def test_ranking_puts_severity_first_then_tokens_gained() -> None:
    def suggestion(title: str, severity: str, gain_tokens: float) -> Suggestion:
        return Suggestion("rule", title, severity, ["evidence"], "effect", "action", gain_tokens)

    ranked = rank(
        [
            suggestion("low, huge gain", "low", 1e9),
            suggestion("medium, small gain", "medium", 5.0),
            suggestion("high", "high", 1.0),
            suggestion("medium, big gain", "medium", 50.0),
        ]
    )
    assert [entry.title for entry in ranked] == [
        "high",
        "medium, big gain",
        "medium, small gain",
        "low, huge gain",
    ]


def test_suggestions_that_turn_the_same_flag_are_merged() -> None:
    def suggestion(rule: str, action: str) -> Suggestion:
        return Suggestion(rule, f"{rule} title", "high", [f"{rule} evidence"], "effect", action)

    merged = merge_same_flag(
        [
            suggestion(
                "cache-size",
                "`--gpu-memory-utilization 0.952` `--num-gpu-blocks-override 3852`",
            ),
            suggestion("dynamic-field", "prompt change: move the field"),
            suggestion("low-free-blocks", "`--num-gpu-blocks-override 3852` (+5.2 GiB), or ..."),
            suggestion("eviction-regret", "`--num-gpu-blocks-override 3852`"),
            suggestion("block-size", "`--block-size 16` (with `--num-gpu-blocks-override 399`)"),
            suggestion(
                "lora-split", "route each family to one adapter; else `--num-gpu-blocks-override 9`"
            ),
        ]
    )
    assert [entry.rule for entry in merged] == [
        "cache-size",
        "dynamic-field",
        "block-size",
        "lora-split",
    ]
    size = merged[0]
    assert size.figures["merged_rules"] == ["low-free-blocks", "eviction-regret"]
    assert size.evidence == [
        "cache-size evidence",
        "also from rule `low-free-blocks`: low-free-blocks title; it suggests "
        "`--num-gpu-blocks-override 3852` (+5.2 GiB), or ...",
        "low-free-blocks evidence",
        "also from rule `eviction-regret`: eviction-regret title; it suggests "
        "`--num-gpu-blocks-override 3852`",
        "eviction-regret evidence",
    ]
    # A pool no memory share holds on the GPU leads with why, then the same knob.
    too_large = merge_same_flag(
        [
            suggestion(
                "cache-size",
                "(no --gpu-memory-utilization holds it: ...; it needs a larger GPU) "
                "`--num-gpu-blocks-override 50000`",
            ),
            suggestion("eviction-regret", "`--num-gpu-blocks-override 50000`"),
        ]
    )
    assert [entry.figures.get("merged_rules") for entry in too_large] == [["eviction-regret"]]
