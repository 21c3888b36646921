"""Replays through the CLI and the library: the Mooncake table, exact accounting, determinism."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.cli import main
from collector.replay.block_manager import CacheSettings
from collector.replay.replayer import ReplayOptions, replay
from collector.store.run_file import RunFile
from tests.support.repo import SECRET

# ../shared/traces/mooncake/README.md: pure LRU over 512-token blocks, block-weighted.
pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version

MOONCAKE_TABLE = {1_000: 0.0841, 5_000: 0.2793, 10_000: 0.4239, 20_000: 0.5718}


@pytest.mark.slow
@pytest.mark.parametrize("num_blocks", sorted(MOONCAKE_TABLE))
def test_mooncake_block_hit_ratio_matches_the_published_table(
    mooncake_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], num_blocks: int
) -> None:
    out = tmp_path / "run.duckdb"
    argv = [
        "replay",
        str(mooncake_trace),
        "--out",
        str(out),
        "--block-size",
        "512",
        "--num-blocks",
        str(num_blocks),
        "--timing",
        "sequential",
        "--json",
        "--quiet",
    ]
    assert main(argv) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["requests"] == 3_993
    assert figures["block_hit_ratio"] == pytest.approx(MOONCAKE_TABLE[num_blocks], abs=0.01)
    # The stored run answers with the same figures.
    assert main(["summary", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary.pop("latency")["clock"] == "modelled"  # summary adds the latency figures
    assert summary == figures


def test_event_accounting_is_exact(mooncake_trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.duckdb"
    options = ReplayOptions(
        settings=CacheSettings(block_size=64, num_blocks=4_000),
        timing="timestamps",
        max_num_seqs=8,
        limit=400,
    )
    summary = replay(mooncake_trace, out, options, SECRET)
    with RunFile.open(out) as run_file:
        stores, evictions, cleared = run_file.row(
            "SELECT count(*) FILTER (WHERE kind = 'store'), count(*) FILTER (WHERE kind = 'evict'),"
            " coalesce(sum(num_cleared), 0) FROM events"
        )
        # At the end every request has finished, so every cached block is free and cached.
        last_pool = run_file.row(
            "SELECT num_cached_free, num_in_use FROM pool ORDER BY seq DESC LIMIT 1"
        )
        seqs = run_file.row(
            "SELECT count(DISTINCT seq), min(seq), max(seq) FROM "
            "(SELECT seq FROM events UNION ALL SELECT seq FROM pool)"
        )
    assert evictions > 0 and summary["preemptions"] >= 0
    assert last_pool[1] == 0
    assert stores - evictions - cleared == last_pool[0]
    assert seqs == (seqs[2] + 1, 0, seqs[2]), "every record stored, no gaps"
    assert summary["hit_tokens"] == summary["vllm_prefix_cache_hits"]
    assert summary["prompt_tokens"] == summary["vllm_prefix_cache_queries"]
    assert summary["dropped_events"] == 0


def test_same_trace_same_options_same_events(mooncake_trace: Path, tmp_path: Path) -> None:
    options = ReplayOptions(
        settings=CacheSettings(block_size=32, num_blocks=8_000),
        timing="timestamps",
        max_num_seqs=4,
        limit=60,
    )
    tables = []
    for name in ("a.duckdb", "b.duckdb"):
        replay(mooncake_trace, tmp_path / name, options, SECRET)
        with RunFile.open(tmp_path / name) as run_file:
            tables.append(
                (
                    run_file.rows("SELECT * FROM events ORDER BY seq"),
                    run_file.rows("SELECT * FROM pool ORDER BY seq"),
                )
            )
    assert tables[0] == tables[1]
    assert len(tables[0][0]) > 1_000
