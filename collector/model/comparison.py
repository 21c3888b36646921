"""Two runs side by side (e.g. block size 16 vs 32 on one trace): their figures, the deltas,
and which run each delta favours; the settings that differ."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import pandas as pd


class ComparedFigure(NamedTuple):
    """A figure both runs have: its name in the figures, its label, whether more is better
    (None: neither), its unit ("ratio" or "count"), and its floor: a change no bigger than
    this (in the figure's own units) is too small to call, however large relatively (1 -> 4
    preemptions is +300 %)."""

    name: str
    label: str
    more_is_better: bool | None
    unit: str = "count"
    floor: float = 0


COMPARED_FIGURES = (
    ComparedFigure("token_hit_ratio", "Hit ratio (tokens)", True, "ratio", 0.005),
    ComparedFigure("block_hit_ratio", "Hit ratio (blocks)", True, "ratio", 0.005),
    ComparedFigure("hit_tokens", "Tokens saved", True, floor=256),
    ComparedFigure("requests", "Requests", None, floor=5),
    ComparedFigure("prompt_tokens", "Prompt tokens", None, floor=256),
    ComparedFigure("block_hits", "Block hits", True, floor=16),
    ComparedFigure("stores", "Blocks stored", None, floor=20),
    ComparedFigure("evictions", "Evictions (blocks)", False, floor=20),
    ComparedFigure("preemptions", "Preemptions", False, floor=5),
    # Any collision is a wrong reuse, any dropped event a short figure: no floor.
    ComparedFigure("collisions", "Collisions", False),
    ComparedFigure("dropped_events", "Dropped events", False),
)

# Counted in blocks: a run with bigger blocks has fewer of them, so runs of different block
# sizes compare them in tokens (blocks x block size), under these labels.
BLOCK_COUNTS = {
    "block_hits": "Block hits (tokens)",
    "stores": "Blocks stored (tokens)",
    "evictions": "Evictions (tokens)",
}

# Where a run's requests came from: a CI report compares two workloads by design.
WORKLOAD_SETTINGS = ("source", "trace")
# What the cache ran with, and the versions that ran it: a difference here explains results.
RUN_SETTINGS = (
    "timing",
    "block_size",
    "num_blocks",
    "hash_algo",
    "max_num_seqs",
    "vllm_version",
    "kvscope_version",
)
COMPARED_SETTINGS = WORKLOAD_SETTINGS + RUN_SETTINGS


def compare_figures(
    first: Mapping[str, Any],
    second: Mapping[str, Any],
    block_sizes: tuple[int, int] | None = None,
) -> pd.DataFrame:
    """Per figure: its unit, both values, second - first, the relative change, the verdict for
    the second run ("better", "worse", "same", or "" where neither direction is better), and
    whether the change is within the figure's floor (`small`: too small to call). Runs
    of different `block_sizes` (first's, second's) compare block counts in tokens: evictions
    per request would halve at twice the block size with nothing else changed."""
    rows = []
    sizes = block_sizes if block_sizes and block_sizes[0] != block_sizes[1] else None
    for name, blocks_label, more_is_better, unit, figure_floor in COMPARED_FIGURES:
        a, b = first[name], second[name]
        label, floor = blocks_label, figure_floor
        if sizes and name in BLOCK_COUNTS:
            label = BLOCK_COUNTS[name]
            a, b = a * sizes[0], b * sizes[1]
            floor *= sizes[0]
        delta = b - a
        if delta == 0:
            verdict = "same"
        elif more_is_better is None:
            verdict = ""
        else:
            verdict = "better" if (delta > 0) == more_is_better else "worse"
        rows.append(
            {
                "figure": name,
                "label": label,
                "unit": unit,
                "first": a,
                "second": b,
                "delta": delta,
                "relative_delta": delta / a if a else None,
                "verdict": verdict,
                "small": delta != 0 and abs(delta) <= floor,
            }
        )
    return pd.DataFrame(rows)


def differing_settings(
    first: Mapping[str, Any], second: Mapping[str, Any], names: Sequence[str] = COMPARED_SETTINGS
) -> list[str]:
    """The settings among `names` whose values differ between the two runs' configs."""
    return [name for name in names if first.get(name) != second.get(name)]


def compare_settings(first: Mapping[str, Any], second: Mapping[str, Any]) -> pd.DataFrame:
    """The runs' settings side by side, and whether each differs."""
    differing = differing_settings(first, second)
    return pd.DataFrame(
        [
            {
                "setting": name,
                "first": str(first.get(name)),
                "second": str(second.get(name)),
                "differs": name in differing,
            }
            for name in COMPARED_SETTINGS
        ]
    )
