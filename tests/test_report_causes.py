"""`kvscope report` compares the miss breakdowns (collector/report/miss_breakdown.py): the
same 120 requests of the sample trace replayed with the sample's 1,200 blocks and with 200,
where the small pool must turn hits into evictions; the cause that grew most is named in the
printed output, report.md, report.html and figures.json, as information, not a check. A run
without lookups (vLLM's KV events alone) has no breakdown, and the report says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.cli import main
from collector.queries.miss_causes import CAUSES, cause_totals
from collector.replay.block_manager import CacheSettings
from collector.store.run_file import RunFile
from collector.vllm_kv.conflicts import HashConflictDetector
from collector.vllm_kv.ingest import append_vllm_batches
from tests.support.repo import SAMPLE_RUN, SAMPLE_TRACE
from tests.support.vllm_kv_pipeline import H, events_run, received, stored

REPLAY = [
    "--block-size", "16", "--timing", "timestamps", "--max-num-seqs", "32",
    "--limit", "120", "--reveal-tenants", "--quiet",
]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("runs")
    made = {}
    for name, num_blocks in (("baseline", "1200"), ("small_pool", "200")):
        made[name] = directory / f"{name}.duckdb"
        argv = ["replay", str(SAMPLE_TRACE), "--out", str(made[name]), *REPLAY]
        assert main([*argv, "--num-blocks", num_blocks]) == 0
    return made


def shares(path: Path) -> tuple[dict[str, int], dict[str, float]]:
    """The run's tokens and share per cause, as `cause_totals` counts them."""
    with RunFile.open(path) as run:
        totals = cause_totals(run)
    return (
        dict(zip(totals["cause"], totals["tokens"].astype(int), strict=True)),
        dict(zip(totals["cause"], totals["share"].astype(float), strict=True)),
    )


def report(out_dir: Path, baseline: Path, candidate: Path) -> int:
    argv = ["report", "--baseline", str(baseline), "--candidate", str(candidate)]
    return main([*argv, "--out-dir", str(out_dir)])


def test_a_smaller_pool_names_evicted_as_the_cause_that_grew_most(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old_tokens, old_shares = shares(runs["baseline"])
    new_tokens, new_shares = shares(runs["small_pool"])
    growth = {cause: new_shares[cause] - old_shares[cause] for cause in CAUSES}
    misses = [cause for cause in CAUSES if cause not in ("hit", "tier")]
    assert max(misses, key=lambda cause: growth[cause]) == "evicted"
    assert growth["evicted"] > 0.2 and growth["hit"] < -0.2  # hits became evictions

    code = report(tmp_path, runs["baseline"], runs["small_pool"])
    out = capsys.readouterr().out
    assert code == 1  # the hit ratio checks regress; the breakdown says why, as no check
    line = (
        f"miss causes: evicted grew most, {old_shares['evicted'] * 100:.1f} % -> "
        f"{new_shares['evicted'] * 100:.1f} % of prompt tokens "
        f"({new_tokens['evicted'] - old_tokens['evicted']:+,} tokens)"
    )
    assert f"\n{line}\nregression: " in out

    figures = json.loads((tmp_path / "figures.json").read_text())
    assert figures["miss_causes"] == {
        "grew_most": {
            "cause": "evicted",
            "name": "evicted",
            "baseline_share": old_shares["evicted"],
            "candidate_share": new_shares["evicted"],
            "baseline_tokens": old_tokens["evicted"],
            "candidate_tokens": new_tokens["evicted"],
        },
        "summary": line,
    }
    assert "miss_causes" not in figures["regressed"]
    assert all("miss" not in check["name"] for check in figures["checks"])
    for label, tokens in (("baseline", old_tokens), ("candidate", new_tokens)):
        breakdown = figures[label]["miss_causes"]
        assert breakdown["unavailable"] is None
        assert {cause: row["tokens"] for cause, row in breakdown["causes"].items()} == tokens
        assert breakdown["prompt_tokens"] == sum(tokens.values())

    markdown = (tmp_path / "report.md").read_text()
    assert f"#### Why prompt tokens missed\n\nM{line[1:]}.\n" in markdown
    evicted_row = (
        f"| evicted | {old_shares['evicted'] * 100:.1f} % ({old_tokens['evicted']:,}) | "
        f"{new_shares['evicted'] * 100:.1f} % ({new_tokens['evicted']:,}) | "
        f"{growth['evicted'] * 100:+.1f} pts |"
    )
    assert evicted_row in markdown.splitlines()
    html = (tmp_path / "report.html").read_text()
    assert "<h2>Why prompt tokens missed</h2>" in html
    assert f"<p>{line.replace('->', '-&gt;')}</p>" in html


def test_a_run_without_lookups_has_no_breakdown_and_the_report_still_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = tmp_path / "events.duckdb"
    run = events_run(events, CacheSettings(16, 1200))
    append_vllm_batches(run, [received(0, stored(H, list(range(16))))], [], HashConflictDetector())
    run.finalize()
    run.close()
    code = report(tmp_path / "report", SAMPLE_RUN, events)
    out = capsys.readouterr().out
    assert code in (0, 1)  # a verdict, not bad input
    line = (
        "miss causes: unavailable for the candidate: the run has no lookups (a run of vLLM's "
        "KV events alone has no requests)"
    )
    assert f"\n{line}\n" in out
    figures = json.loads((tmp_path / "report" / "figures.json").read_text())
    assert figures["miss_causes"] == {"grew_most": None, "summary": line}
    assert figures["candidate"]["miss_causes"]["prompt_tokens"] == 0
    assert figures["baseline"]["miss_causes"]["unavailable"] is None
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert f"#### Why prompt tokens missed\n\nM{line[1:]}.\n" in markdown
