"""The miss-cause charts (visualizer/charts/miss_causes.py) and the Overview's verdict on real
runs: the small SHARED_PREFIX run (tests/support/runs.py: a cold block, two hits, a key
mismatch, four partial blocks) and the sample; what each figure draws is the queries' data,
exactly."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from collector.queries.miss_causes import (
    CAUSE_NAMES,
    cause_totals,
    family_losses,
    lookup_causes,
    request_block_causes,
)
from collector.store.run_file import RunFile
from tests.support.repo import SAMPLE_RUN
from tests.support.runs import shared_prefix_run
from visualizer import request_blocks
from visualizer.charts import miss_causes as charts
from visualizer.miss_breakdown import unexplained_line, verdict


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> RunFile:
    return RunFile.open(shared_prefix_run(Path(tmp_path_factory.mktemp("miss_charts"))))


@pytest.fixture(scope="module")
def sample() -> RunFile:
    return RunFile.open(SAMPLE_RUN)


def test_the_waterfall_draws_the_cause_totals(small: RunFile) -> None:
    totals = cause_totals(small)
    (bars,) = charts.waterfall_figure(totals).data
    # a0 4 cold + 4 partial, b0 8 hit + 4 partial, a1 4 hit + 4 partial, c0 4 key + 4 partial
    assert list(bars.y) == [
        "hit",
        "cold (first sight)",
        "same tokens, another key",
        "partial last block",
        "prompt tokens looked up",
    ]
    assert list(bars.x) == [12, 4, 4, 16, 36]
    assert list(bars.base) == [0, 12, 16, 20, 0]  # each step starts where the last ended
    assert list(bars.text) == [
        "12 (33.3%)",
        "4 (11.1%)",
        "4 (11.1%)",
        "16 (44.4%)",
        "36 (100 %)",
    ]


def test_the_waterfall_on_the_sample_equals_its_totals(sample: RunFile) -> None:
    totals = cause_totals(sample)
    (bars,) = charts.waterfall_figure(totals).data
    shown = totals[totals["tokens"] > 0]
    assert list(bars.y)[:-1] == [CAUSE_NAMES[cause] for cause in shown["cause"]]
    assert list(bars.x) == [*shown["tokens"], int(totals["tokens"].sum())]
    assert bars.x[-1] == sum(bars.x[:-1])


def test_the_verdict_names_the_share_served_and_the_biggest_loss(
    small: RunFile, sample: RunFile
) -> None:
    assert verdict(cause_totals(small)) == (
        "33.3% of prompt tokens were served from the cache; the biggest loss is partial "
        "last block: 44.4% (16 tokens)."
    )
    assert verdict(cause_totals(sample)) == (
        "53.6% of prompt tokens were served from the cache; the biggest loss is diverged "
        "from a cached prefix: 26.9% (133,552 tokens)."
    )
    assert unexplained_line(lookup_causes(sample), 1) is None  # the sample explains all


def test_unexplained_tokens_say_why() -> None:
    rows = pd.DataFrame(
        {
            "cause": ["hit", "unexplained", "unexplained"],
            "reason": [None, "never_stored", "no_token_ids"],
            "tokens": [60, 10, 30],
        }
    )
    line = unexplained_line(rows, 100)
    assert line is not None
    assert line.startswith("Unexplained, 40.0% of the prompt tokens (30 tokens: neither token ids")
    assert "; 10 tokens: the request never stored this block" in line


def test_the_family_losses_stack_each_familys_tokens_by_cause(sample: RunFile) -> None:
    losses = family_losses(sample).assign(
        label=lambda frame: [f"family {f % 97}" for f in frame["family"]]
    )
    losses = losses.assign(family_hex="")
    figure = charts.family_losses_figure(losses)
    drawn = {
        (trace.name, label): tokens
        for trace in figure.data
        for label, tokens in zip(trace.y, trace.x, strict=True)
    }
    assert drawn == {
        (CAUSE_NAMES[cause], label): tokens
        for cause, label, tokens in zip(
            losses["cause"], losses["label"], losses["tokens"], strict=True
        )
    }
    assert list(figure.layout.yaxis.categoryarray) == list(dict.fromkeys(losses["label"]))


def test_the_block_strip_covers_each_lookup_with_its_causes(sample: RunFile) -> None:
    request = "report-14"
    causes = lookup_causes(sample, request)
    blocks = request_block_causes(sample, request)
    segments = request_blocks.segments(causes, blocks, 16, {})
    figure = charts.block_strip_figure(segments)
    drawn: dict[tuple[str, str], int] = {}
    for trace in figure.data:
        for lookup, tokens in zip(trace.y, trace.x, strict=True):
            drawn[trace.name, lookup] = drawn.get((trace.name, lookup), 0) + tokens
    names = request_blocks.lookup_names(causes)
    assert drawn == {
        (CAUSE_NAMES[cause], names[seq]): tokens
        for seq, cause, tokens in zip(causes["seq"], causes["cause"], causes["tokens"], strict=True)
    }
    # Every lookup's segments tile its prompt: no gap, no overlap.
    for _seq, own in segments.groupby("seq"):
        ordered = own.sort_values("start")
        assert list(ordered["start"]) == [0, *ordered["tokens"].cumsum()[:-1]]
