"""The GPU pool and vLLM's CPU offload tier apart, from vLLM's own KV event classes: per-medium
counts and blocks held over time known by hand, the hash-conflict detector per medium, and the
page's tier section (absent on a run with GPU events only)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from collector.queries.vllm_kv import (
    vllm_kv_activity,
    vllm_kv_media,
    vllm_kv_summary,
    vllm_kv_tier_occupancy,
)
from collector.replay.block_manager import CacheSettings
from collector.store.run_file import RunFile
from collector.vllm_kv.conflicts import HashConflictDetector
from collector.vllm_kv.ingest import append_vllm_batches
from collector.vllm_kv.wire import ReceivedBatch
from tests.support.app import go_to, metrics, start
from tests.support.vllm_kv_pipeline import events_run, through_the_wire
from visualizer.charts.vllm_kv import vllm_kv_tier_occupancy_figure

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version

PAGE = "views/vllm_kv_events.py"
A, B, C, D = 0xA000_0001, 0xB000_0002, 0xC000_0003, 0xD000_0004
TOKENS = {A: [1, 2, 3, 4], B: [5, 6, 7, 8], C: [9, 10, 11, 12], D: [13, 14, 15, 16]}
PARENTS = {A: None, B: A, C: B, D: None}


def stored(hashes: list[int], medium: str | None, **fields: Any) -> Any:
    """vLLM's BlockStored of consecutive blocks of four tokens, as its GPU pool (or, with
    medium "CPU", its offloading connector's self-describing events) publishes them."""
    from vllm.distributed.kv_events import BlockStored  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    block = {
        "block_hashes": hashes,
        "parent_block_hash": PARENTS[hashes[0]],
        "token_ids": [token for block_hash in hashes for token in TOKENS[block_hash]],
        "block_size": 4,
        "lora_id": None,
        "medium": medium,
        "lora_name": None,
        "group_idx": 0,
    }
    return BlockStored(**(block | fields))


def removed(hashes: list[int], medium: str) -> Any:
    from vllm.distributed.kv_events import BlockRemoved  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    return BlockRemoved(block_hashes=hashes, medium=medium, group_idx=0)


def cleared() -> Any:
    from vllm.distributed.kv_events import AllBlocksCleared  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    return AllBlocksCleared()


def batch(ts: float, *events: Any, dp_rank: int = 0) -> Any:
    from vllm.distributed.kv_events import KVEventBatch  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    return KVEventBatch(ts=ts, events=list(events), data_parallel_rank=dp_rank)


def tier_batches() -> list[Any]:
    """One batch a second. The CPU tier takes two chunks of two blocks, [A, B] and [B, C]
    (B announced twice), then evicts [A, B]: B stays, in the second chunk. The cache clear
    empties the GPU pool only. D comes from a GPU that names no medium (older vLLMs)."""
    return [
        batch(1000.0, stored([A, B], "GPU")),
        batch(1001.0, stored([A, B], "CPU"), stored([C], "GPU")),
        batch(1002.0, stored([B, C], "CPU"), removed([A], "GPU")),
        batch(1003.0, removed([A, B], "CPU")),
        batch(1004.0, cleared()),
        batch(1005.0, stored([D], None)),
    ]


def write_run(path: Path, *streams: list[ReceivedBatch]) -> Path:
    """A finished run file of these streams, as `kvscope collect --vllm-kv-events` stores."""
    run = events_run(path, CacheSettings(4, 16))
    detector = HashConflictDetector()
    for stream in streams:
        append_vllm_batches(run, stream, [], detector)
    run.finalize()
    run.close()
    return path


@pytest.fixture(scope="module")
def tier_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiers") / "run.duckdb"
    return write_run(path, through_the_wire(tier_batches()))


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GPU events only, some with medium "GPU", some (older vLLMs) with none."""
    path = tmp_path_factory.mktemp("gpu") / "run.duckdb"
    batches = [
        batch(1000.0, stored([A, B], "GPU")),
        batch(1001.0, removed([A], "GPU")),
        batch(1002.0, stored([D], None)),
    ]
    return write_run(path, through_the_wire(batches))


def rows(frame: pd.DataFrame) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in frame.itertuples(index=False)]


def test_each_medium_counts_its_own_stores_and_removals(tier_run: Path) -> None:
    with RunFile.open(tier_run) as run:
        media = vllm_kv_media(run)
        summary = vllm_kv_summary(run)
    assert rows(media) == [("GPU", 4, 1), ("CPU", 4, 2)]
    assert list(media.columns) == ["medium", "stored_blocks", "removed_blocks"]
    # The totals are every medium's together, as before.
    assert (summary["stored_blocks"], summary["removed_blocks"], summary["clears"]) == (8, 3, 1)
    assert summary["conflicts"] == 0


def test_blocks_held_over_time_per_medium(tier_run: Path) -> None:
    """Buckets of one second: one batch each."""
    with RunFile.open(tier_run) as run:
        occupancy = vllm_kv_tier_occupancy(run, num_buckets=5)
    seconds = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    gpu = [2, 3, 2, 2, 0, 1]  # A B; + C; - A; (CPU only); cleared; + D
    cpu = [0, 2, 3, 2, 2, 2]  # -; + A B; + B C (B twice); - A B (B still once); -; -
    assert rows(occupancy) == [
        *((t_s, "GPU", held) for t_s, held in zip(seconds, gpu, strict=True)),
        *((t_s, "CPU", held) for t_s, held in zip(seconds, cpu, strict=True)),
    ]


def test_activity_of_one_medium(tier_run: Path) -> None:
    """The same buckets as every medium's; the clear is the GPU pool's."""
    with RunFile.open(tier_run) as run:
        cpu = vllm_kv_activity(run, num_buckets=5, medium="CPU")
        gpu = vllm_kv_activity(run, num_buckets=5, medium="GPU")
        every = vllm_kv_activity(run, num_buckets=5)
    assert rows(cpu) == [(1.0, 2, 0, 0), (2.0, 2, 0, 0), (3.0, 0, 2, 0)]
    assert rows(gpu) == [
        (0.0, 2, 0, 0),
        (1.0, 1, 0, 0),
        (2.0, 0, 1, 0),
        (4.0, 0, 0, 1),
        (5.0, 1, 0, 0),
    ]
    assert every[["stored", "removed", "cleared"]].sum().tolist() == [8, 3, 1]


def test_restarts_ranks_and_removals_never_seen_stored(tmp_path: Path) -> None:
    """The tier evicts X, stored before the collector started: nothing to count. Rank 0's
    engine restarts at 2002 s (a new epoch): its blocks are gone, rank 1's stay."""
    rank_0_before = through_the_wire(
        [
            batch(2000.0, removed([A], "CPU"), stored([A], "GPU")),
            batch(2001.0, stored([A], "CPU")),
        ]
    )
    rank_1 = through_the_wire([batch(2001.0, stored([A], "GPU"), dp_rank=1)])
    rank_0_after = through_the_wire([batch(2002.0, stored([D], "GPU"))], epoch=1)
    path = write_run(tmp_path / "run.duckdb", rank_0_before, rank_1, rank_0_after)
    with RunFile.open(path) as run:
        occupancy = vllm_kv_tier_occupancy(run, num_buckets=2)
        media = vllm_kv_media(run)
    assert rows(occupancy) == [
        (0.0, "GPU", 1),
        (1.0, "GPU", 2),  # A on both ranks: two blocks
        (2.0, "GPU", 2),  # rank 0's A gone with its restart, D; rank 1's A
        (0.0, "CPU", 0),
        (1.0, "CPU", 1),
        (2.0, "CPU", 0),  # the restart emptied rank 0's tier too
    ]
    assert rows(media) == [("GPU", 3, 0), ("CPU", 1, 1)]


def conflicts_of(vllm_batches: list[Any]) -> tuple[list[tuple[int, int]], HashConflictDetector]:
    """(first batch, second batch) of each conflict the detector finds, and the detector."""
    detector = HashConflictDetector()
    found = detector.observe(through_the_wire(vllm_batches))
    return [(conflict.first.seq, conflict.second.seq) for conflict in found], detector


def test_vllms_placeholder_tier_events_are_not_conflicts() -> None:
    """By default vLLM's offloading connector announces a chunk by its hash alone (no tokens,
    no parent, block size 0): nothing to compare with the GPU pool's block of that hash."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.events import (  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
        OffloadingEventsTracker,
    )
    from vllm.v1.core.kv_cache_utils import BlockHash, maybe_convert_block_hash  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.v1.kv_offload.base import (  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
        Medium,
        OffloadingEvent,
        OffloadingKVEventsConfig,
        make_offload_key,
    )

    full_hash = bytes(range(24)) + A.to_bytes(8, "big")
    assert maybe_convert_block_hash(BlockHash(full_hash)) == A  # vLLM's default: low 64 bits
    tracker = OffloadingEventsTracker(OffloadingKVEventsConfig(True, False))
    key = make_offload_key(full_hash, 0)
    (placeholder,) = tracker.take_events([OffloadingEvent([key], Medium.CPU, removed=False)])
    (evicted,) = tracker.take_events([OffloadingEvent([key], Medium.CPU, removed=True)])
    assert (placeholder.medium, placeholder.token_ids, placeholder.block_size) == ("CPU", [], 0)
    found, detector = conflicts_of(
        [
            batch(1.0, stored([A], "GPU")),
            batch(2.0, placeholder),
            batch(3.0, evicted),
        ]
    )
    assert found == []
    assert (detector.num_blocks_checked, detector.num_blocks_unchecked) == (1, 1)
    assert detector.num_tracked == 1  # the GPU pool's block, still cached


def test_a_tier_block_without_the_gpus_extra_keys_is_not_a_conflict() -> None:
    """vLLM's self-describing tier events leave extra keys out (it defers them): the same
    block as the GPU pool's, which had a cache salt. Other tokens in the tier still are."""
    found, _ = conflicts_of(
        [
            batch(1.0, stored([A], "GPU", extra_keys=[("tenant-salt",)])),
            batch(2.0, stored([A], "CPU")),
            batch(3.0, stored([A], "CPU", token_ids=[9, 9, 9, 9])),
        ]
    )
    assert found == [(1, 2)]


def test_a_cache_clear_keeps_the_tier_and_a_tier_eviction_keeps_the_gpu_pool() -> None:
    found, _ = conflicts_of(
        [
            batch(1.0, stored([A], "GPU"), stored([A], "CPU")),
            batch(2.0, cleared()),  # the GPU pool's only: the tier still holds A
            batch(3.0, stored([A], "CPU", token_ids=[9, 9, 9, 9])),
            batch(4.0, stored([B], "GPU"), stored([B], "CPU")),
            batch(5.0, removed([B], "CPU")),  # the tier's only: the GPU pool still holds B
            batch(6.0, stored([B], "GPU", token_ids=[9, 9, 9, 9])),
        ]
    )
    assert found == [(0, 2), (3, 5)]


def test_the_occupancy_chart_draws_a_step_line_per_medium() -> None:
    occupancy = pd.DataFrame(
        {
            "t_s": [0.0, 1.0, 0.0, 1.0],
            "medium": ["GPU", "GPU", "CPU", "CPU"],
            "blocks_held": [2, 1, 0, 3],
        }
    )
    figure = vllm_kv_tier_occupancy_figure(occupancy)
    assert [trace.name for trace in figure.data] == ["GPU pool", "CPU tier"]
    assert [list(trace.y) for trace in figure.data] == [[2, 1], [0, 3]]
    assert {trace.line.shape for trace in figure.data} == {"hv"}


def plotted(values: list[float] | dict[str, str]) -> list[float]:
    """A trace's values from a Plotly spec (arrays travel as base64 typed arrays)."""
    if isinstance(values, list):
        return values
    raw = base64.b64decode(values["bdata"])
    return [float(value) for value in np.frombuffer(raw, dtype=values["dtype"])]


def open_page(run: Path) -> AppTest:
    app = go_to(start(run), PAGE)
    assert [title.value for title in app.title] == ["vLLM's KV events"]
    return app


def limits_text(app: AppTest) -> str:
    return " ".join(block.value for block in app.markdown)


def test_the_page_shows_the_gpu_pool_and_the_cpu_tier_apart(tier_run: Path) -> None:
    app = open_page(tier_run)
    shown = metrics(app)
    assert {label: shown[label] for label in shown if ": " in label} == {
        "GPU pool: blocks stored": "4",
        "GPU pool: blocks removed": "1",
        "GPU pool: blocks held at the end": "1",
        "CPU tier: blocks stored": "4",
        "CPU tier: blocks removed": "2",
        "CPU tier: blocks held at the end": "2",
    }
    assert shown["Blocks stored"] == "8"  # every medium's, as before
    assert "GPU pool and CPU tier" in [header.value for header in app.subheader]
    charts = [json.loads(chart.proto.spec) for chart in app.get("plotly_chart")]
    titles = [spec["layout"]["title"]["text"] for spec in charts]
    assert titles == [
        "What vLLM's KV events reported over time",
        "Blocks held by the GPU pool and each offload tier",
        "What the CPU tier's events reported over time",
    ]
    gpu_line, cpu_line = charts[1]["data"]
    assert (gpu_line["name"], cpu_line["name"]) == ("GPU pool", "CPU tier")
    assert (plotted(gpu_line["y"])[-1], plotted(cpu_line["y"])[-1]) == (1, 2)
    assert (max(plotted(gpu_line["y"])), max(plotted(cpu_line["y"]))) == (3, 3)
    limits = limits_text(app)
    assert "No tier hits" in limits
    assert "tokens loaded back from the tier" in limits
    assert "kvscope's\n  engine plugin, whose lookup records carry the tokens" in limits


def test_a_run_with_gpu_events_only_shows_no_tier_section(gpu_run: Path) -> None:
    app = open_page(gpu_run)
    assert list(metrics(app)) == [
        "Batches received",
        "Blocks stored",
        "Blocks removed",
        "Cache clears",
        "Batches lost",
        "Resent by vLLM's replay",
        "Hash conflicts",
        "Published hashes",
    ]
    assert metrics(app)["Blocks stored"] == "3"
    assert len(app.get("plotly_chart")) == 1
    assert not any("GPU pool" in header.value for header in app.subheader)
    assert "No tier hits" not in limits_text(app)
