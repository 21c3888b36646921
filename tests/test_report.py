"""`kvscope report` end to end: real replays of the sample trace, real run files, exit codes."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from xml.etree import ElementTree

import pytest

from collector.cli import main
from collector.report.markdown import MARKER
from tests.support.block_manager import tiny_run
from tests.support.repo import REPO, SAMPLE_TRACE

# The sample trace's first 200 requests, replayed as the sample run is (sample_data/regenerate.sh).
REPLAY = [
    "--block-size", "16", "--timing", "timestamps", "--max-num-seqs", "32",
    "--limit", "200", "--reveal-tenants",
]  # fmt: skip
# A cache a quarter the size must hurt every hit ratio and raise evictions and their regret;
# the pool runs empty in both runs (so running empty is no regression), neither preempts
# more per request, and neither has collisions or lost events.
SMALL_CACHE_REGRESSIONS = [
    "token_hit_ratio",
    "block_hit_ratio",
    "tokens_saved",
    "evictions_per_request",
    "eviction_regret",
    "tenant_hit_ratio[acme]",
    "tenant_hit_ratio[globex]",
    "tenant_hit_ratio[globex/globex-sql]",
    "tenant_hit_ratio[initech]",
]
EXAMPLE = REPO / "docs" / "ci" / "example"


@pytest.fixture(scope="module")
def sample_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sample trace replayed twice: the sample's 1,200 blocks, and only 300."""
    directory = tmp_path_factory.mktemp("runs")
    runs = {}
    for name, num_blocks in (("baseline", "1200"), ("small_cache", "300")):
        runs[name] = directory / f"{name}.duckdb"
        argv = ["replay", str(SAMPLE_TRACE), "--out", str(runs[name]), "--quiet"]
        assert main([*argv, *REPLAY, "--num-blocks", num_blocks]) == 0
    return runs


def report(out_dir: Path, baseline: Path, candidate: Path, *options: str) -> int:
    argv = ["report", "--baseline", str(baseline), "--candidate", str(candidate)]
    return main([*argv, "--out-dir", str(out_dir), *options])


def failed_junit_cases(path: Path) -> list[str]:
    suite = ElementTree.parse(path).getroot().find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert int(suite.attrib["tests"]) == len(cases)
    return [case.attrib["name"] for case in cases if case.find("failure") is not None]


def test_a_much_smaller_cache_regresses_exactly_the_cache_checks(
    sample_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = report(tmp_path, sample_runs["baseline"], sample_runs["small_cache"])
    out = capsys.readouterr().out
    assert code == 1
    assert f"regression: {', '.join(SMALL_CACHE_REGRESSIONS)}\n" in out
    figures = json.loads((tmp_path / "figures.json").read_text())
    assert figures["verdict"] == "regression"
    assert figures["regressed"] == SMALL_CACHE_REGRESSIONS
    passed = [check["name"] for check in figures["checks"] if check["status"] == "pass"]
    assert passed == [
        "min_free_blocks",
        "pool_not_empty",
        "preemptions_per_request",
        "collisions",
        "dropped_events",
    ]
    assert failed_junit_cases(tmp_path / "junit.xml") == SMALL_CACHE_REGRESSIONS
    markdown = (tmp_path / "report.md").read_text()
    names = ", ".join(f"`{name}`" for name in SMALL_CACHE_REGRESSIONS)
    assert f"Regressed: {names}\n" in markdown
    assert "(9 of 14 checks failed)" in markdown
    assert "num_blocks differs: 1200 in the baseline, 300 in the candidate." in markdown


def test_figures_are_the_runs_own(sample_runs: dict[str, Path], tmp_path: Path) -> None:
    report(tmp_path, sample_runs["baseline"], sample_runs["small_cache"])
    figures = json.loads((tmp_path / "figures.json").read_text())
    assert main(["summary", str(sample_runs["small_cache"]), "--json"]) == 0
    baseline, candidate = figures["baseline"], figures["candidate"]
    assert baseline["summary"]["num_blocks"] == 1200
    assert candidate["summary"]["num_blocks"] == 300
    assert candidate["summary"]["requests"] == 200
    evictions = candidate["summary"]["evictions"]
    assert candidate["evictions_per_request"] == pytest.approx(evictions / 200)
    assert candidate["eviction_regret"]["evictions"] == evictions
    assert candidate["free_blocks"]["usable_blocks"] == 299
    tenants = {row["tenant"] + "/" + row["lora"] for row in candidate["tenants"]}
    assert tenants == {"acme/(none)", "globex/(none)", "globex/globex-sql", "initech/(none)"}
    token_check = figures["checks"][0]
    assert token_check["name"] == "token_hit_ratio"
    assert token_check["baseline"] == baseline["summary"]["token_hit_ratio"]
    assert token_check["limit"] == pytest.approx(baseline["summary"]["token_hit_ratio"] - 0.02)


def test_a_run_against_itself_passes(
    sample_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = sample_runs["small_cache"]
    assert report(tmp_path, run, run) == 0
    assert "pass: no check regressed\n" in capsys.readouterr().out
    figures = json.loads((tmp_path / "figures.json").read_text())
    assert figures["verdict"] == "pass"
    assert {check["status"] for check in figures["checks"]} == {"pass"}
    assert failed_junit_cases(tmp_path / "junit.xml") == []
    markdown = (tmp_path / "report.md").read_text()
    assert markdown.startswith(f"{MARKER}\n### ✅ kvscope: prefix caching holds (14 checks passed)")
    assert "Notes:" not in markdown


def test_loose_thresholds_pass_the_smaller_cache(
    sample_runs: dict[str, Path], tmp_path: Path
) -> None:
    thresholds = tmp_path / "loose.toml"
    thresholds.write_text(
        "[token_hit_ratio]\nmax_drop = 0.5\n[block_hit_ratio]\nmax_drop = 0.5\n"
        "[tokens_saved]\nmax_relative_drop = 0.5\n[evictions_per_request]\nenabled = false\n"
        "[eviction_regret]\nmax_increase = 0.5\n[tenant_hit_ratio]\nmax_drop = 0.5\n"
    )
    out = tmp_path / "out"
    argv = ["--thresholds", str(thresholds)]
    assert report(out, sample_runs["baseline"], sample_runs["small_cache"], *argv) == 0
    figures = json.loads((out / "figures.json").read_text())
    skipped = [check["name"] for check in figures["checks"] if check["status"] == "skip"]
    assert skipped == ["evictions_per_request"]
    assert figures["thresholds"]["source"] == str(thresholds)
    assert figures["thresholds"]["tokens_saved"] == {
        "enabled": True,
        "max_relative_drop": 0.5,
        "min_drop": 256,
    }


def test_a_timestamp_at_the_start_of_the_system_prompt_regresses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CI example's path: prompt templates -> traces -> replays -> report."""
    candidate_templates = tmp_path / "templates"
    shutil.copytree(EXAMPLE / "templates", candidate_templates)
    for name in ("support_system.txt", "billing_system.txt"):
        system_prompt = candidate_templates / name
        system_prompt.write_text("Current time: $now\n" + system_prompt.read_text())
    traces = {}
    for role, templates in (
        ("baseline", EXAMPLE / "templates"),
        ("candidate", candidate_templates),
    ):
        traces[role] = tmp_path / f"{role}.jsonl.gz"
        argv = ["prompt-trace", str(EXAMPLE / "prompt_set.jsonl"), "--templates", str(templates)]
        assert main([*argv, "--out", str(traces[role])]) == 0
    out = tmp_path / "report"
    replay = ["--num-blocks", "2000", "--reveal-tenants"]
    assert report(out, traces["baseline"], traces["candidate"], *replay) == 1
    expected = [
        "token_hit_ratio",
        "block_hit_ratio",
        "tokens_saved",
        "tenant_hit_ratio[billing]",
        "tenant_hit_ratio[support]",
    ]
    assert f"regression: {', '.join(expected)}\n" in capsys.readouterr().out
    figures = json.loads((out / "figures.json").read_text())
    assert figures["regressed"] == expected
    assert figures["baseline"]["summary"]["token_hit_ratio"] > 0.85
    assert figures["candidate"]["summary"]["token_hit_ratio"] < 0.10
    # 48 prompts, each 21 tokens longer ("Current time: 2026-11-29 14:03:10" and a newline).
    assert figures["notes"] == [
        "prompt_tokens differs: 17,908 in the baseline, 18,916 in the candidate "
        "(the prompts changed)."
    ]
    assert sorted(path.name for path in out.glob("*.duckdb")) == [
        "baseline.duckdb",
        "candidate.duckdb",
    ]


def test_an_emptied_pool_and_new_preemptions_fail_the_report(tmp_path: Path) -> None:
    """Twelve long-decoding requests at once, on a roomy pool and on one they fill: the
    tight one runs out of free blocks and preempts, which the roomy one never did."""
    generator = random.Random(7)
    rows = [
        {
            "request_id": f"r{index}",
            "timestamp": 0,
            "token_ids": [generator.randrange(1_000, 30_000) for _ in range(12)],
            "output_length": 60,
        }
        for index in range(12)
    ]
    runs = {}
    for name, num_blocks in (("roomy", 400), ("tight", 40)):
        (tmp_path / name).mkdir()
        runs[name] = tiny_run(
            tmp_path / name, rows, num_blocks=num_blocks, timing="timestamps", max_num_seqs=8
        )
    assert report(tmp_path / "out", runs["roomy"], runs["tight"]) == 1
    figures = json.loads((tmp_path / "out" / "figures.json").read_text())
    checks = {check["name"]: check for check in figures["checks"]}
    assert (checks["pool_not_empty"]["baseline"], checks["pool_not_empty"]["candidate"]) == (
        figures["baseline"]["free_blocks"]["min_free_blocks"],
        0,
    )
    assert checks["pool_not_empty"]["status"] == "fail"
    assert figures["baseline"]["summary"]["preemptions"] == 0
    assert figures["candidate"]["summary"]["preemptions"] > 0
    assert checks["preemptions_per_request"]["status"] == "fail"
