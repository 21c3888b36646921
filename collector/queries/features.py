"""Which of the optional things a run can hold it does hold: several KV cache groups (a hybrid
model), several engines, vLLM's own KV events, the collision check. The app leaves out of its
navigation the pages a run has nothing for (visualizer/page_selection.py)."""

from __future__ import annotations

from typing import TypedDict

from collector.queries.fleet import num_engines
from collector.queries.kv_groups import layout
from collector.store.run_file import RunFile


class RunFeatures(TypedDict):
    kv_groups: int  # KV cache groups (1: one full-attention group, every block figure its own)
    hybrid: bool  # groups other than one full-attention group
    engines: int  # engine id x DP rank among requests and pool snapshots
    vllm_kv_events: bool  # any batch received from vLLM's KV events, or any batch lost
    collisions_checked: bool  # the run was recorded with the collision check on


def run_features(run: RunFile) -> RunFeatures:
    """The run's optional features: a few small reads (its options, whether vLLM KV event
    tables have a row, and the engines among arrivals, lookups and pool snapshots)."""
    row = run.row(
        """
        SELECT EXISTS (SELECT 1 FROM vllm_kv_batches) OR EXISTS (SELECT 1 FROM vllm_kv_gaps),
            (SELECT coalesce(CAST(json_extract(options, '$.check_collisions') AS BOOLEAN), false)
             FROM runs)
        """
    )
    assert row is not None
    groups = layout(run)
    return {
        "kv_groups": len(groups),
        "hybrid": not (len(groups) == 1 and groups[0].kind == "full"),
        "engines": num_engines(run),
        "vllm_kv_events": bool(row[0]),
        "collisions_checked": bool(row[1]),
    }
