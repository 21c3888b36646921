"""Markers and the Overview's pools where engines ran with other settings: engines shipping
to a real `kvscope collect` (vLLM's manager under kvscope's hooks, the sample trace's
requests), which keeps each engine's settings from its batches' headers."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.queries.fleet import engine_starts
from collector.queries.timeline import run_calendar
from collector.replay.block_manager import CacheSettings, make_block_hasher, make_kv_cache_manager
from collector.replay.simulator import Simulator, VirtualClock
from collector.replay.traces import read_trace
from collector.store.run_file import RunFile
from engine_hooks import EventBuffer, KVCacheHooks, Pseudonymizer
from engine_hooks.transport import Transport
from tests.support.app import start
from tests.support.engine import collector_process, stop_collector, wait_for
from tests.support.repo import SAMPLE_TRACE
from visualizer.engine_markers import engine_markers

pytestmark = pytest.mark.vllm  # vLLM's own KV cache manager under the hooks

NS = 1_000_000_000


def _engine_to_collector(
    endpoint: str, engine_id: str, settings: CacheSettings, after_s: float = 0.0
) -> None:
    """An engine: the sample trace's first 30 requests through vLLM's manager, its hooks'
    clock `after_s` on, shipped to a collector with its settings in every batch's header."""
    manager = make_kv_cache_manager(settings)
    buffer, clock = EventBuffer(), VirtualClock()
    hooks = KVCacheHooks(
        manager,
        buffer,
        pseudonymizer=Pseudonymizer(b"k"),
        clock=lambda: int(after_s * NS) + clock(),
    )
    config = {
        "block_size": settings.block_size,
        "num_blocks": settings.num_blocks,
        "hash_algo": settings.hash_algo,
        "vllm_version": "0.34.0",
        "model": "tiny-llama",
    }
    transport = Transport(buffer, endpoint, engine_id=engine_id, config=config).start()
    simulator = Simulator(manager, hooks.attach(), clock, make_block_hasher(settings), lambda: None)
    simulator.run_sequential(read_trace(SAMPLE_TRACE)[:30], lambda _: None)
    wait_for(lambda: transport.num_delivered == hooks.num_records)
    transport.stop()
    hooks.detach()


def _collected(directory: Path, engines: list[tuple[str, CacheSettings, float]]) -> Path:
    """A run file written by `kvscope collect` from these engines, one after another."""
    run, endpoint = directory / "run.duckdb", f"ipc://{directory}/hooks"
    with collector_process(run, endpoint) as process:
        for engine_id, settings, after_s in engines:
            _engine_to_collector(endpoint, engine_id, settings, after_s)
        stop_collector(process)
    return run


def test_a_restart_with_another_block_size_is_named_and_one_with_the_same_is_not(
    tmp_path: Path,
) -> None:
    """host:1 runs with blocks of 16 tokens and 120 blocks; host:2 (a restart) with 32 and
    200; host:3 (restarted again) with the same as host:2."""
    small, large = CacheSettings(16, 120), CacheSettings(32, 200)
    run_path = _collected(
        tmp_path, [("host:1", small, 0.0), ("host:2", large, 600.0), ("host:3", large, 1200.0)]
    )
    with RunFile.open(run_path) as run:
        starts = engine_starts(run)
        window = run_calendar(run).grid.whole_run()
    assert starts["engine_id"].tolist() == ["host:1", "host:2", "host:3"]
    assert starts["block_size"].tolist() == [16, 32, 32]
    assert starts["num_blocks"].tolist() == [120, 200, 200]
    assert starts["pool_blocks"].tolist() == [119, 199, 199]  # the null block is not usable
    assert starts["hash_algo"].tolist() == ["sha256"] * 3
    labels = engine_markers(starts, window)["label"].tolist()
    assert labels == [
        "host:2 started, 199 blocks (was 119), block size 32 (was 16)",
        "host:3 started, 199 blocks",
    ]
    app = start(run_path)
    assert not app.exception, app.exception
    (line,) = [c.value.replace("\\", "") for c in app.caption if c.value.startswith("Engines")]
    assert "host:2 started, 199 blocks (was 119), block size 32 (was 16)" in line
    assert line.endswith("host:3 started, 199 blocks")
    (heading,) = [c.value.replace("\\", "") for c in app.caption if "run.duckdb:" in c.value]
    assert (
        "3 engines: block size 16, 120 blocks (host:1); block size 32, 200 blocks "
        "(host:2, host:3), sha256" in heading
    )


def test_the_overview_of_a_fleet_with_different_pools_states_each(tmp_path: Path) -> None:
    """Two engines side by side through one collector, one of 120 blocks and one of 200
    (the run's settings are the first's): the Overview says each one's pool."""
    run_path = _collected(
        tmp_path, [("host:a", CacheSettings(16, 120), 0.0), ("host:b", CacheSettings(16, 200), 0.0)]
    )
    with RunFile.open(run_path) as run:
        starts = engine_starts(run)
        window = run_calendar(run).grid.whole_run()
    assert starts["num_blocks"].tolist() == [120, 200] and starts["t_s"].tolist() == [0.0, 0.0]
    assert engine_markers(starts, window).empty  # both started the run: nothing changed
    app = start(run_path)
    assert not app.exception, app.exception
    (heading,) = [c.value.replace("\\", "") for c in app.caption if "run.duckdb:" in c.value]
    assert "block size 16, 2 engines: 120 blocks (host:a), 200 blocks (host:b), sha256" in heading
    assert "of 120 blocks each" not in heading
    # The run configuration table says the same, not the first engine's pool for the fleet.
    (table,) = [frame.value for frame in app.dataframe if "setting" in frame.value.columns]
    shown = dict(zip(table["setting"], table["value"], strict=True))
    assert shown["block size and pool"] == (
        "block size 16, 2 engines: 120 blocks (host:a), 200 blocks (host:b)"
    )
    assert "KV cache pool" not in shown and "block size" not in shown
