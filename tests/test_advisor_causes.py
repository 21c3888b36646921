"""The advisor reads the miss breakdown: each rule that fixes a miss cause quotes the tokens
that cause lost, exactly as `cause_totals` and the rows of `lookup_causes` give them for the
same run, on hand-built traces (the tokens also written out by hand) and on the sample run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.advisor import RULES, RunContext, Suggestion, advise
from collector.advisor.dynamic_field import DivergingField, diverging_fields
from collector.advisor.miss_breakdown import quote_causes
from collector.queries.miss_causes import cause_totals, lookup_causes
from collector.replay.block_manager import CacheSettings
from collector.store.run_file import RunFile
from tests.support.fleet import family_trace
from tests.support.repo import SAMPLE_RUN
from tests.support.vllm_kv_pipeline import events_run
from tests.test_advisor_routing import fleet_run
from tests.test_advisor_rules import cyclic_rows, judge, report_rows, run_of, tenant_rows

pytestmark = pytest.mark.vllm  # replays through vLLM's own code: runs on every supported version

LINE = "the miss breakdown of the prompt tokens looked up (`kvscope explain`): "


def rows_sum(run: Path, cause: str, key_kind: str | None = None) -> int:
    """The tokens of the run's `lookup_causes` rows of `cause` (and `key_kind`), summed here."""
    with RunFile.open(run) as run_file:
        rows = lookup_causes(run_file)
    chosen = rows[rows["cause"] == cause]
    if key_kind is not None:
        chosen = chosen[chosen["key_kind"] == key_kind]
    return int(chosen["tokens"].sum())


def total(run: Path, cause: str) -> tuple[int, float]:
    """`cause_totals`' tokens and share of one cause."""
    with RunFile.open(run) as run_file:
        totals = cause_totals(run_file).set_index("cause")
    return int(totals.loc[cause, "tokens"]), float(totals.loc[cause, "share"])


def quoted(suggestion: Suggestion) -> list[str]:
    return [line for line in suggestion.evidence if line.startswith(LINE)]


def test_a_salt_per_request_quotes_its_key_mismatches(tmp_path: Path) -> None:
    options = {"num_blocks": 100, "record_token_ids": True, "reveal_tenants": True}
    run = run_of(tmp_path, "salted", tenant_rows(lambda index: f"salt-{index}"), **options)
    _, (suggestion,), _ = judge(run, "per-request-salt")
    # Ten prompts of 23 tokens (20 shared); the 9 after the first miss the shared 5 blocks of 4.
    assert rows_sum(run, "key_mismatch", "cache_salt") == 9 * 20 == total(run, "key_mismatch")[0]
    assert suggestion.figures["cause_tokens"] == 9 * 20
    assert suggestion.figures["cause_share"] == total(run, "key_mismatch")[1] == 180 / 230
    assert quoted(suggestion) == [
        LINE + "180 (78.3%) missed as the same tokens under another cache salt"
    ]


def test_without_token_ids_the_salt_rule_quotes_0_tokens_and_the_unexplained(
    tmp_path: Path,
) -> None:
    """The rule fires from the salts alone; the breakdown cannot tell a key mismatch without
    token ids or the key-free fingerprints (off with the collision check), and the quote
    says 0 and how many are unexplained."""
    options = {"num_blocks": 100, "reveal_tenants": True, "check_collisions": False}
    run = run_of(tmp_path, "salted", tenant_rows(lambda index: f"salt-{index}"), **options)
    status, (suggestion,), _ = judge(run, "per-request-salt")
    assert status == "fired"
    unexplained = rows_sum(run, "unexplained")
    assert unexplained == total(run, "unexplained")[0] == 10 * 20  # every request's 5 blocks
    assert suggestion.figures["cause_tokens"] == 0
    assert quoted(suggestion) == [
        LINE + "0 (0.0%) missed as the same tokens under another cache salt; 200 more are "
        "unexplained: without token ids or key-free fingerprints a key mismatch cannot be told "
        "from a new prefix"
    ]


def test_a_lora_split_quotes_its_key_mismatches(tmp_path: Path) -> None:
    rows = tenant_rows(lambda index: None, lambda index: "sql" if index % 2 else None)
    run = run_of(tmp_path, "mixed", rows, num_blocks=100, record_token_ids=True)
    _, (suggestion,), _ = judge(run, "lora-split")
    # The first request under the adapter misses the 20 tokens the base model had cached.
    assert rows_sum(run, "key_mismatch", "lora") == 20
    assert suggestion.figures["miss_causes"] == {"key_mismatch:lora": 20}
    assert quoted(suggestion) == [
        LINE + "20 (8.7%) missed as the same tokens under another LoRA adapter"
    ]


def test_a_dynamic_field_quotes_the_diverged_tokens_and_links_them(tmp_path: Path) -> None:
    options = {"num_blocks": 400, "record_token_ids": True}
    run = run_of(tmp_path, "stamped", report_rows(stamped=True), **options)
    _, (suggestion,), _ = judge(run, "dynamic-field")
    # Each of the 11 requests after the first misses tokens 8-119 (28 blocks of 4) as diverged.
    assert rows_sum(run, "diverged") == total(run, "diverged")[0] == 11 * 112
    assert suggestion.figures["cause_tokens"] == suggestion.figures["family_cause_tokens"] == 1232
    assert quoted(suggestion) == [
        LINE + "1,232 (83.5%) missed as diverged from a cached prefix; 1,232 of them are the "
        "`report-*` requests'"
    ]
    with RunFile.open(run) as run_file:
        assert diverging_fields(run_file, run) == [DivergingField("report-*", 12, 8, 18, 1232)]
    plain = run_of(tmp_path, "plain", report_rows(stamped=False), **options)
    unrecorded = run_of(tmp_path, "unrecorded", report_rows(stamped=True), num_blocks=400)
    for other in (plain, unrecorded):
        with RunFile.open(other) as run_file:
            assert diverging_fields(run_file, other) == []


def test_the_cache_size_quotes_the_evicted_tokens_once_when_merged(tmp_path: Path) -> None:
    # Four prompts of two cacheable blocks cycle through six usable blocks: LRU keeps nothing.
    run = run_of(tmp_path, "thrashing", cyclic_rows(4, 8), num_blocks=7)
    evicted, preempted = rows_sum(run, "evicted"), rows_sum(run, "preempted")
    # Rounds 2 to 8 of the four prompts miss their two blocks (8 tokens), each evicted.
    assert (evicted, preempted) == (7 * 4 * 8, 0)
    line = LINE + "224 (77.8%) missed as evicted, 0 (0.0%) as own blocks lost to preemption"
    for rule in ("cache-size", "eviction-regret"):
        _, (suggestion,), _ = judge(run, rule)
        assert suggestion.figures["miss_causes"] == {"evicted": 224, "preempted": 0}
        assert quoted(suggestion) == [line]
    chosen = tuple(entry for entry in RULES if entry[0] in ("cache-size", "eviction-regret"))
    with RunFile.open(run) as run_file:
        (merged,) = advise(RunContext(run_file, run), chosen).suggestions
    assert merged.figures["merged_rules"] == ["eviction-regret"]
    assert quoted(merged) == [line]


def test_routing_quotes_the_tokens_cached_on_another_engine(tmp_path: Path) -> None:
    run = fleet_run(tmp_path, family_trace(), "round-robin", record_token_ids=True)
    chosen = tuple(entry for entry in RULES if entry[0] == "routing")
    with RunFile.open(run) as run_file:
        (suggestion,) = advise(RunContext(run_file, run), chosen).suggestions
    # A1 and B3 find their family's two blocks on the other engine (tests/test_miss_causes.py).
    assert rows_sum(run, "other_engine") == 2 * 8
    assert suggestion.figures["cause_tokens"] == 16
    assert suggestion.figures["cause_share"] == total(run, "other_engine")[1] == 16 / 96
    assert quoted(suggestion) == [LINE + "16 (16.7%) missed as cached on another engine"]


def test_a_run_without_lookups_quotes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "events.duckdb"
    events_run(path, CacheSettings(16, 100)).close()
    with RunFile.open(path) as run_file:
        context = RunContext(run_file, path)
        assert context.miss_breakdown is None
        quote = quote_causes(context.miss_breakdown, "evicted")
        assert (quote.lines, quote.figures) == ([], {})
        assert diverging_fields(run_file, path) == []


def test_on_the_sample_the_quotes_are_the_breakdowns(tmp_path: Path) -> None:
    """The sample run: the dynamic-field and LoRA rules quote `cause_totals` exactly, and the
    report-* family's diverged tokens are its requests' rows."""
    chosen = tuple(entry for entry in RULES if entry[0] in ("dynamic-field", "lora-split"))
    with RunFile.open(SAMPLE_RUN) as run_file:
        totals = cause_totals(run_file).set_index("cause")
        rows = lookup_causes(run_file)
        suggestions = advise(RunContext(run_file, SAMPLE_RUN), chosen).suggestions
        (field,) = diverging_fields(run_file, SAMPLE_RUN)
    by_rule = {suggestion.rule: suggestion for suggestion in suggestions}
    diverged = by_rule["dynamic-field"].figures
    assert diverged["cause_tokens"] == totals.loc["diverged", "tokens"]
    assert diverged["cause_share"] == totals.loc["diverged", "share"]
    reports = rows[(rows["cause"] == "diverged") & rows["request_id"].str.startswith("report-")]
    assert diverged["family_cause_tokens"] == int(reports["tokens"].sum()) == field.diverged_tokens
    assert (field.label, field.requests, field.start, field.end) == ("report-*", 60, 20, 28)
    lora = by_rule["lora-split"].figures
    mismatches = rows[(rows["cause"] == "key_mismatch") & (rows["key_kind"] == "lora")]
    assert lora["cause_tokens"] == int(mismatches["tokens"].sum())
    assert lora["cause_tokens"] == totals.loc["key_mismatch", "tokens"]  # the sample's all lora
    assert json.dumps(diverged) and json.dumps(lora)  # the JSON output carries them
