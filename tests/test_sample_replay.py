"""Replaying the committed sample trace with the settings of sample_data/regenerate.sh gives
the committed sample run, table for table and row for row: whatever changes in how records
are built, shipped and stored (the sample was made by an earlier kvscope), the run is the
same."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.cli import main
from collector.store.run_file import RunFile
from tests.support.repo import SAMPLE_RUN, SAMPLE_TRACE

# What differs between two replays of one trace: the run's identity, when it ran, where the
# trace was read from, and the vLLM of the window that replayed it (the samples were made on
# 0.33; benchmarks/vllm_versions.py shows the versions' records equal).
RUN_IDENTITY = {"run_id", "trace", "started_at", "finished_at", "vllm_version"}
# The key-free fingerprints (keyed with the secret: the same in every replay) came after the
# committed samples were made: compared once the samples hold them.
FINGERPRINTS = {"token_fingerprint"}


def test_replaying_the_sample_trace_gives_the_committed_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSCOPE_SECRET", "kvscope-sample")
    run = tmp_path / "run.duckdb"
    arguments = ["replay", str(SAMPLE_TRACE), "--out", str(run), "--block-size", "16"]
    arguments += ["--num-blocks", "1200", "--max-num-seqs", "32"]  # the scheduler timing
    arguments += ["--record-token-ids", "--tokenizer", "mistral_common:data/tokenizer.model.v1"]
    arguments += ["--reveal-tenants", "--check-collisions", "--quiet", "--no-advise"]
    assert main(arguments) == 0
    with RunFile.open(run) as replayed, RunFile.open(SAMPLE_RUN) as committed:
        tables = [row[0] for row in committed.rows("SHOW TABLES")]
        fingerprinted = committed.row("SELECT count(token_fingerprint) > 0 FROM events")
        left_out = RUN_IDENTITY if fingerprinted == (True,) else RUN_IDENTITY | FINGERPRINTS
        assert {"events", "pool", "collisions", "requests", "prefix_blocks"} <= set(tables)
        for table in tables:
            columns = [row[0] for row in committed.rows(f"DESCRIBE {table}")]
            kept = ", ".join(f'"{column}"' for column in columns if column not in left_out)
            # A finished run's record of its own row counts (meta "contents", written by
            # `finalize` since this stop) is newer than the committed samples.
            where = " WHERE key <> 'contents'" if table == "meta" else ""
            query = f"SELECT {kept} FROM {table}{where} ORDER BY ALL"
            assert replayed.rows(query) == committed.rows(query), table
        assert len(committed.rows("SELECT seq FROM events")) > 90_000
        unfingerprinted = (
            "SELECT count(*) FROM events WHERE kind = 'store' AND token_fingerprint IS NULL"
        )
        assert replayed.row(unfingerprinted) == (0,)  # every stored block has its fingerprint
