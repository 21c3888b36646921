"""The report's checks, thresholds and renderers on handcrafted figures: exact verdicts."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from collector.queries.tenants import TenantHitRatio
from collector.report.checks import run_checks
from collector.report.figures import RunFigures
from collector.report.junit import render_junit
from collector.report.markdown import render_markdown
from collector.report.thresholds import Thresholds, load_thresholds
from collector.report.verdict import compare
from tests.support.repo import REPO


def run_figures(
    name: str = "run.duckdb",
    tenants: list[TenantHitRatio] | None = None,
    regret_ratio: float = 0.2,
    min_free_blocks: int = 100,
    **summary: Any,
) -> RunFigures:
    """Figures of an imaginary run: 100 requests, 50 % hit ratios, 3 evictions each."""
    figures = {
        "requests": 100,
        "token_hit_ratio": 0.5,
        "block_hit_ratio": 0.5,
        "hit_tokens": 10_000,
        "prompt_tokens": 20_000,
        "evictions": 300,
        "collisions": 0,
        "dropped_events": 0,
        "preemptions": 0,
        "block_size": 16,
        "num_blocks": 1_001,
        "hash_algo": "sha256",
    }
    figures.update(summary)
    return RunFigures(
        path=Path(name),
        config={"source": "replay", "trace": "t.jsonl", "timing": "sequential", "num_blocks": 1001},
        summary=figures,
        regret={"evictions": 300, "restored": 0, "regret_ratio": regret_ratio},
        free_blocks={"min_free_blocks": min_free_blocks, "usable_blocks": 1_000},
        tenants=tenants if tenants is not None else [],
    )


def tenant(name: str, hit_ratio: float, requests: int = 50, lora: str = "(none)") -> TenantHitRatio:
    return TenantHitRatio(
        tenant=name,
        lora=lora,
        requests=requests,
        prompt_tokens=1_000,
        hit_tokens=round(1_000 * hit_ratio),
        hit_ratio=hit_ratio,
    )


def statuses(baseline: RunFigures, candidate: RunFigures, **sections: Any) -> dict[str, str]:
    thresholds = dataclasses.replace(Thresholds(), **sections)
    return {check.name: check.status for check in run_checks(baseline, candidate, thresholds)}


def test_the_documented_defaults_are_the_defaults() -> None:
    assert load_thresholds(REPO / "docs" / "ci" / "thresholds.toml") == Thresholds()
    assert load_thresholds(None) == Thresholds()


def test_a_file_overrides_only_what_it_names(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text("[token_hit_ratio]\nmax_drop = 0.1\n[dropped_events]\nmax = 3\n")
    thresholds = load_thresholds(path)
    assert thresholds.token_hit_ratio.max_drop == 0.1
    assert thresholds.token_hit_ratio.min == 0.0
    assert thresholds.dropped_events.max == 3
    assert thresholds.block_hit_ratio == Thresholds().block_hit_ratio


def test_identical_runs_pass_every_check() -> None:
    run = run_figures(tenants=[tenant("a", 0.4)])
    assert set(statuses(run, run).values()) == {"pass"}


@pytest.mark.parametrize(
    ("candidate", "expected_failures"),
    [
        # 2 points under is still in; a hair more is out (the hit tokens move along).
        (run_figures(token_hit_ratio=0.48, block_hit_ratio=0.48), []),
        (run_figures(token_hit_ratio=0.4799), ["token_hit_ratio"]),
        (run_figures(block_hit_ratio=0.47), ["block_hit_ratio"]),
        (run_figures(hit_tokens=9_500), []),
        (run_figures(hit_tokens=9_499), ["tokens_saved"]),
        # 3 evictions per request: the limit is 3 * 1.1 + 1 = 4.3.
        (run_figures(evictions=430), []),
        (run_figures(evictions=431), ["evictions_per_request"]),
        (run_figures(regret_ratio=0.25), []),
        (run_figures(regret_ratio=0.26), ["eviction_regret"]),
        # 10 % free at the worst moment; 5 points less is the limit.
        (run_figures(min_free_blocks=50), []),
        (run_figures(min_free_blocks=49), ["min_free_blocks"]),
        (run_figures(collisions=1), ["collisions"]),
        (run_figures(dropped_events=1), ["dropped_events"]),
    ],
)
def test_each_limit_is_exact(candidate: RunFigures, expected_failures: list[str]) -> None:
    verdicts = statuses(run_figures(), candidate)
    assert [name for name, status in verdicts.items() if status == "fail"] == expected_failures


def test_an_emptied_pool_fails_unless_the_baseline_ran_empty_too() -> None:
    # 2.5 % free at the worst moment, then none: 2.5 points is inside min_free_blocks' 5.
    verdicts = statuses(run_figures(min_free_blocks=25), run_figures(min_free_blocks=0))
    assert [name for name, status in verdicts.items() if status == "fail"] == ["pool_not_empty"]
    assert statuses(run_figures(min_free_blocks=0), run_figures(min_free_blocks=0)) == {
        name: "pass" for name in verdicts
    }
    allowed = dataclasses.replace(Thresholds().min_free_blocks, allow_empty=True)
    verdicts = statuses(
        run_figures(min_free_blocks=25), run_figures(min_free_blocks=0), min_free_blocks=allowed
    )
    assert verdicts["pool_not_empty"] == "skip"
    assert "fail" not in verdicts.values()


@pytest.mark.parametrize(
    ("baseline", "candidate", "fails"),
    [
        (0, 0, False),
        # The floor: 5 preemptions the baseline lacked pass, a sixth fails.
        (0, 5, False),
        (0, 6, True),
        # 0.10 per request: 0.10 * 1.1 = 0.11 relative, 0.10 + 5 / 100 = 0.15 with the floor.
        (10, 15, False),
        (10, 16, True),
        # Many: the relative limit is the more lenient, 1.00 * 1.1 = 1.10 per request.
        (100, 110, False),
        (100, 111, True),
    ],
)
def test_preemptions_per_request(baseline: int, candidate: int, fails: bool) -> None:
    verdicts = statuses(run_figures(preemptions=baseline), run_figures(preemptions=candidate))
    failures = [name for name, status in verdicts.items() if status == "fail"]
    assert failures == (["preemptions_per_request"] if fails else [])


@pytest.mark.parametrize(
    ("evictions", "fails"),
    [
        # Baseline: 3 evictions of 16 tokens per request, 48 tokens; the limit is 48 * 1.1
        # + 1 * 16 = 68.8 evicted tokens per request.
        (220, True),  # 2.2 of 32 tokens: 70.4 per request, though fewer blocks than 3
        (210, False),  # 67.2
        (140, False),
    ],
)
def test_evictions_compare_in_tokens_across_block_sizes(evictions: int, fails: bool) -> None:
    candidate = run_figures(evictions=evictions, block_size=32)
    checks = {check.name: check for check in run_checks(run_figures(), candidate, Thresholds())}
    check = checks["evictions_per_request"]
    assert (check.status == "fail") == fails
    assert (check.baseline, check.candidate) == (48, evictions / 100 * 32)
    assert "evicted tokens per request" in check.title


def test_floors_fail_whatever_the_baseline_did(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text("[token_hit_ratio]\nmin = 0.6\n[min_free_blocks]\nmin = 0.2\n")
    thresholds = load_thresholds(path)
    run = run_figures()
    checks = {check.name: check for check in run_checks(run, run, thresholds)}
    assert checks["token_hit_ratio"].status == "fail"
    assert checks["token_hit_ratio"].limit == 0.6
    assert checks["min_free_blocks"].status == "fail"
    assert checks["block_hit_ratio"].status == "pass"


def test_collisions_fail_even_when_the_baseline_had_them() -> None:
    verdicts = statuses(run_figures(collisions=4), run_figures(collisions=4))
    assert verdicts["collisions"] == "fail"


def test_tenant_checks() -> None:
    # tenant, adapter, requests, hit ratio in the baseline and in the candidate (None: absent)
    table = [
        ("acme", "(none)", 50, 0.60, 0.55),
        ("acme", "sql", 50, 0.50, 0.44),
        ("globex", "(none)", 50, 0.40, 0.45),
        ("tiny", "(none)", 3, 0.90, 0.10),
        ("gone", "(none)", 50, 0.50, None),
        ("new", "(none)", 50, None, 0.50),
    ]
    baseline, candidate = (
        run_figures(
            tenants=[
                tenant(name, ratio, requests, lora)
                for name, lora, requests, *ratios in table
                if (ratio := ratios[run]) is not None
            ]
        )
        for run in (0, 1)
    )
    checks = [
        (check.name, check.status, check.reason)
        for check in run_checks(baseline, candidate, Thresholds())
        if check.name.startswith("tenant_hit_ratio")
    ]
    assert checks == [
        ("tenant_hit_ratio[acme]", "pass", ""),
        ("tenant_hit_ratio[acme/sql]", "fail", "under the limit"),
        ("tenant_hit_ratio[globex]", "pass", ""),
        ("tenant_hit_ratio[gone]", "skip", "only in the baseline run"),
        ("tenant_hit_ratio[new]", "skip", "only in the candidate run"),
        ("tenant_hit_ratio[tiny]", "skip", "3 requests, fewer than min_requests = 10"),
    ]


def test_disabled_checks_are_skipped_not_dropped() -> None:
    limits = Thresholds()
    verdicts = statuses(
        run_figures(tenants=[tenant("a", 0.5)]),
        run_figures(evictions=10_000, tenants=[tenant("a", 0.1)]),
        evictions_per_request=dataclasses.replace(limits.evictions_per_request, enabled=False),
        tenant_hit_ratio=dataclasses.replace(limits.tenant_hit_ratio, enabled=False),
    )
    assert verdicts["evictions_per_request"] == "skip"
    assert verdicts["tenant_hit_ratio"] == "skip"
    assert "fail" not in verdicts.values()


def test_markdown_and_junit_name_the_same_regressions() -> None:
    baseline = run_figures("main.duckdb", tenants=[tenant("a|b", 0.5)])
    candidate = run_figures(
        "pr.duckdb", token_hit_ratio=0.3, hit_tokens=6_000, tenants=[tenant("a|b", 0.2)]
    )
    comparison = compare(baseline, candidate, Thresholds(), "defaults")
    markdown = render_markdown(comparison)
    assert "### ❌ kvscope: prefix caching regressed (3 of 11 checks failed)" in markdown
    assert "Regressed: `token_hit_ratio`, `tokens_saved`, `tenant_hit_ratio[a\\|b]`" in markdown
    assert (
        "| ❌ | token hit ratio (`token_hit_ratio`) | 50.0 % | 30.0 % | -20.0 pts | ≥ 48.0 % |"
        in markdown
    )
    assert (
        "| ✅ | evictions per request (`evictions_per_request`) | 3.00 | 3.00 | +0.0 % |"
        in markdown
    )
    assert "| run file | `main.duckdb` | `pr.duckdb` |" in markdown
    root = ElementTree.fromstring(render_junit(comparison))
    suite = root.find("testsuite")
    assert suite is not None
    assert (suite.attrib["tests"], suite.attrib["failures"], suite.attrib["skipped"]) == (
        "11",
        "3",
        "0",
    )
    failures = {
        case.attrib["name"]: failure.attrib["message"]
        for case in suite.iter("testcase")
        if (failure := case.find("failure")) is not None
    }
    assert list(failures) == ["token_hit_ratio", "tokens_saved", "tenant_hit_ratio[a|b]"]
    assert failures["tokens_saved"] == (
        "prompt tokens served from the cache: candidate 6,000, baseline 10,000, "
        "limit ≥ 9,500 (fail)"
    )


def test_small_counts_do_not_fail_a_build_by_default() -> None:
    # The case: 1 -> 4 preemptions in 500 requests is +300 %, and 3 preemptions.
    verdicts = statuses(
        run_figures(requests=500, preemptions=1), run_figures(requests=500, preemptions=4)
    )
    assert verdicts["preemptions_per_request"] == "pass"
    # Evictions in 10 requests: 1 block per request relative (10), 20 in all as the floor.
    few = {"requests": 10, "evictions": 0}
    assert statuses(run_figures(**few), run_figures(**few | {"evictions": 20})) == {
        name: "pass" for name in statuses(run_figures(**few), run_figures(**few))
    }
    failed = statuses(run_figures(**few), run_figures(**few | {"evictions": 21}))
    assert [name for name, status in failed.items() if status == "fail"] == [
        "evictions_per_request"
    ]
    # Tokens saved: 5 % of 2,000 is 100 tokens, under the 256-token floor.
    small = run_figures(hit_tokens=2_000)
    assert statuses(small, run_figures(hit_tokens=1_744))["tokens_saved"] == "pass"
    assert statuses(small, run_figures(hit_tokens=1_743))["tokens_saved"] == "fail"
    # Turning a floor off restores the relative limit alone.
    strict = dataclasses.replace(Thresholds().preemptions_per_request, min_count_increase=0)
    verdicts = statuses(
        run_figures(requests=500, preemptions=1),
        run_figures(requests=500, preemptions=4),
        preemptions_per_request=strict,
    )
    assert verdicts["preemptions_per_request"] == "fail"
