"""Run versus run: every figure's delta and verdict; the settings that differ."""

from __future__ import annotations

import math
from typing import Any

from collector.model import comparison

FIRST: dict[str, Any] = {
    "token_hit_ratio": 0.5,
    "block_hit_ratio": 0.5,
    "hit_tokens": 100,
    "requests": 10,
    "prompt_tokens": 200,
    "block_hits": 10,
    "stores": 20,
    "evictions": 8,
    "preemptions": 2,
    "collisions": 0,
    "dropped_events": 0,
}


def test_compare_figures() -> None:
    second = FIRST | {"token_hit_ratio": 0.6, "hit_tokens": 120, "evictions": 4, "stores": 30}
    table = comparison.compare_figures(FIRST, second)
    rows = {row["figure"]: row for row in table.to_dict("records")}
    assert rows["token_hit_ratio"]["verdict"] == "better"
    hit_tokens = rows["hit_tokens"]
    assert hit_tokens | {"relative_delta": round(hit_tokens["relative_delta"], 9)} == {
        "figure": "hit_tokens",
        "label": "Tokens saved",
        "unit": "count",
        "first": 100,
        "second": 120,
        "delta": 20,
        "relative_delta": 0.2,
        "verdict": "better",
        "small": True,  # 20 tokens: within the floor of 256
    }  # fmt: skip
    assert rows["evictions"]["verdict"] == "better"  # fewer evictions
    assert rows["stores"]["verdict"] == ""  # more stores is neither better nor worse
    assert rows["requests"]["verdict"] == "same"
    assert math.isnan(rows["collisions"]["relative_delta"])  # no relative change from zero
    assert table["figure"].tolist() == [figure.name for figure in comparison.COMPARED_FIGURES]
    assert rows["token_hit_ratio"]["unit"] == "ratio"


def test_changes_within_a_floor_are_too_small_to_call() -> None:
    # The case: 1 -> 4 preemptions is +300 %, and 3 preemptions.
    table = comparison.compare_figures(FIRST | {"preemptions": 1}, FIRST | {"preemptions": 4})
    rows = {row["figure"]: row for row in table.to_dict("records")}
    assert (rows["preemptions"]["relative_delta"], rows["preemptions"]["small"]) == (3.0, True)
    assert not rows["requests"]["small"]  # unchanged: nothing to call small
    many = comparison.compare_figures(FIRST, FIRST | {"preemptions": 8})
    assert not many.set_index("figure").loc["preemptions", "small"]  # 6 more: over the floor
    # Any collision counts.
    assert not comparison.compare_figures(FIRST, FIRST | {"collisions": 1})["small"].any()


def test_block_counts_compare_in_tokens_across_block_sizes() -> None:
    # Block size 16, then 32: 5 evictions of 16 tokens (80) against 4 of 32 (128) is worse,
    # though fewer blocks.
    second = FIRST | {"evictions": 4, "block_hits": 5, "preemptions": 3}
    table = comparison.compare_figures(FIRST | {"evictions": 5}, second, (16, 32))
    rows = {row["figure"]: row for row in table.to_dict("records")}
    evictions = rows["evictions"]
    assert (evictions["label"], evictions["first"], evictions["second"]) == (
        "Evictions (tokens)",
        80,
        128,
    )
    assert (evictions["verdict"], rows["preemptions"]["verdict"]) == ("worse", "worse")
    assert rows["block_hits"]["second"] == 5 * 32
    same = comparison.compare_figures(FIRST, second, (16, 16))
    assert same.loc[same["figure"] == "evictions", "label"].item() == "Evictions (blocks)"


def test_compare_settings() -> None:
    first = {"source": "replay", "block_size": 16, "num_blocks": 1200, "hash_algo": "sha256"}
    second = first | {"block_size": 32, "num_blocks": 600}
    table = comparison.compare_settings(first, second)
    assert table[table["differs"]].to_dict("records") == [
        {"setting": "block_size", "first": "16", "second": "32", "differs": True},
        {"setting": "num_blocks", "first": "1200", "second": "600", "differs": True},
    ]
