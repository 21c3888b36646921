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
    }  # fmt: skip
    assert rows["evictions"]["verdict"] == "better"  # fewer evictions
    assert rows["stores"]["verdict"] == ""  # more stores is neither better nor worse
    assert rows["requests"]["verdict"] == "same"
    assert math.isnan(rows["collisions"]["relative_delta"])  # no relative change from zero
    assert table["figure"].tolist() == [figure.name for figure in comparison.COMPARED_FIGURES]
    assert rows["token_hit_ratio"]["unit"] == "ratio"


def test_block_counts_only_compare_at_one_block_size() -> None:
    second = FIRST | {"evictions": 4, "block_hits": 5, "preemptions": 3}
    rows = {
        row["figure"]: row["verdict"]
        for row in comparison.compare_figures(FIRST, second, same_block_size=False).to_dict(
            "records"
        )
    }
    assert (rows["evictions"], rows["block_hits"], rows["preemptions"]) == ("", "", "worse")


def test_compare_settings() -> None:
    first = {"source": "replay", "block_size": 16, "num_blocks": 1200, "hash_algo": "sha256"}
    second = first | {"block_size": 32, "num_blocks": 600}
    table = comparison.compare_settings(first, second)
    assert table[table["differs"]].to_dict("records") == [
        {"setting": "block_size", "first": "16", "second": "32", "differs": True},
        {"setting": "num_blocks", "first": "1200", "second": "600", "differs": True},
    ]
