"""`kvscope advise` on the committed sample run: the dynamic-timestamp family and the cache
size the sweep recommends, with numbers; Markdown and JSON agree."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from collector.advisor.cache_size import SCHEDULER_SOURCE, TARGET_FRACTION
from collector.cli import main
from collector.model.mrc import miss_ratio_curve
from collector.queries.requests import run_block_stream
from collector.store.run_file import RunFile
from tests.support.repo import SAMPLE_RUN


@pytest.fixture(scope="module")
def advice_json() -> dict:
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        assert main(["advise", str(SAMPLE_RUN), "--json", "--no-store"]) == 0
    return json.loads(output.getvalue())


def by_rule(document: dict, rule: str) -> dict:
    (suggestion,) = [entry for entry in document["suggestions"] if entry["rule"] == rule]
    return suggestion


def test_names_the_dynamic_timestamp_family(advice_json: dict) -> None:
    field = by_rule(advice_json, "dynamic-field")
    # The sample's report-* prompts, in Mistral's tokens: "<s>Daily operations report.
    # Generated at 2026-11-29 " (20 tokens), "HH:MM:SS" (8, a digit each), then " UTC.", the
    # instructions, the example table and "Figures:" (491), then the day's figures.
    assert field["figures"]["family"] == "report-*"
    assert field["figures"]["field_start"] == 20
    assert field["figures"]["field_tokens"] == 8
    assert field["figures"]["agreement_tokens"] == 491
    assert field["figures"]["requests"] == 60
    assert field["gain_tokens"] > 0
    assert field["action"].startswith("prompt change: move the 8-token field at token 20")


def test_recommends_the_cache_size_of_the_curve(advice_json: dict) -> None:
    size = by_rule(advice_json, "cache-size")
    recommended = size["figures"]["recommended_num_blocks"]
    with RunFile.open(SAMPLE_RUN) as run_file:
        block_size, stream = run_block_stream(run_file)
    curve = miss_ratio_curve(stream, block_size)
    target = TARGET_FRACTION * curve.token_hit_ratio(1 << 30)
    assert curve.token_hit_ratio(recommended) >= target > curve.token_hit_ratio(recommended - 1)
    assert recommended > advice_json["run_config"]["num_blocks"] == 1_200
    # The sample's requests overlap (up to 32 at once) and it recorded its prompts: its pool
    # and the curve's pick are replayed through vLLM's Scheduler, which gives the ratios. The
    # sample is itself such a replay, so at its own pool the check measures what it did; at
    # the pick, the curve (one request at a time) comes within a point of it.
    assert size["figures"]["source"] == SCHEDULER_SOURCE
    assert size["figures"]["current_token_hit_ratio"] == advice_json["token_hit_ratio"]
    assert size["figures"]["recommended_token_hit_ratio"] == pytest.approx(
        curve.token_hit_ratio(recommended), abs=0.01
    )
    # Sized on the default GPU (80 GiB, at vLLM's 0.9 now): the memory share first.
    extra_gib = (recommended - 1_200) * 2 * 32 * 8 * 128 * 2 * 16 / 2**30
    utilization = 0.9 + extra_gib / 80
    assert size["action"] == (
        f"`--gpu-memory-utilization {utilization:.3f}` `--num-gpu-blocks-override {recommended}`"
    )


def test_markdown_says_the_same_with_numbers(
    advice_json: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["advise", str(SAMPLE_RUN), "--no-store"]) == 0
    markdown = capsys.readouterr().out
    size = by_rule(advice_json, "cache-size")["figures"]
    assert f"Grow the KV cache to {size['recommended_num_blocks']:,} blocks" in markdown
    assert f"{size['recommended_token_hit_ratio']:.1%}" in markdown
    assert "+8 GiB of KV cache (+4,096 blocks)" in markdown
    assert "`report-*` prompts carry a dynamic field at token 20" in markdown
    assert "differ for 8 tokens (20-27" in markdown
    assert "agree again for 491 tokens" in markdown
    titles = [line for line in markdown.splitlines() if line.startswith("## ")]
    ranked = [entry["title"] for entry in advice_json["suggestions"]]
    assert titles == [f"## {rank}. {title}" for rank, title in enumerate(ranked, 1)] + ["## Checks"]


def test_a_file_that_is_not_a_run_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bogus = tmp_path / "bogus.duckdb"
    bogus.write_text("no")
    assert main(["advise", str(bogus)]) == 2
    assert f"{bogus}: not a DuckDB file, so not a kvscope run" in capsys.readouterr().err
