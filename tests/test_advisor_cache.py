"""The advisor's replays through vLLM, kept between runs of `kvscope advise`: the second run
of the sample reads the advice kept, an advice under other assumptions replays nothing, and
each says the same, byte for byte; a run whose bytes changed is replayed again; a cache
folder that cannot be written costs the replays, never an error."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from collector.advisor.replay_cache import ReplayCache
from collector.cli import main
from tests.support.repo import SAMPLE_RUN


def advise(capsys: pytest.CaptureFixture[str], *options: str) -> tuple[dict[str, Any], str]:
    assert main(["advise", str(SAMPLE_RUN), "--json", "--no-store", *options]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def test_a_second_advice_replays_nothing_and_says_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(tmp_path))
    cold, cold_progress = advise(capsys)
    kept, kept_progress = advise(capsys)
    assert kept == cold
    # The advice itself was kept (in the cache folder: --no-store leaves the sample alone),
    # so the second run reads it, in two lines, and runs no rule.
    assert kept_progress.splitlines()[1].startswith("  the advice worked out at ")
    assert "[1/14]" not in kept_progress
    # Under another assumption the rules run again, on the replays read back.
    warm, warm_progress = advise(capsys, "--pcie-gb-per-s", "24")
    assert warm["suggestions"][0] == cold["suggestions"][0]  # the cache size: no tier in it
    # The first run replays through vLLM's Scheduler (the cache-size rule) and with a CPU
    # tier, and says so before it starts; the third reads both back.
    assert "replaying the run through vLLM's Scheduler at 2 pool sizes" in cold_progress
    assert "replaying the run with a CPU tier" in cold_progress
    assert "replaying" not in warm_progress
    # 2 pool sizes, the tiers, and the two advices (each assumption's)
    assert len(list((tmp_path / "advisor").glob("*.json"))) == 5
    # Progress: the run first, then every rule's outcome, numbered.
    lines = warm_progress.splitlines()
    assert lines[0] == f"advising on {SAMPLE_RUN}: 14 rules to check"
    assert lines[1].startswith("  [1/14] cache-size: fired (")
    assert lines[-2].startswith("  [14/14] hybrid-alignment: skipped (")
    assert lines[-1] == "the advice kept in kvscope's cache folder"


def test_a_changed_run_is_replayed_again(tmp_path: Path) -> None:
    run = tmp_path / "run.duckdb"
    shutil.copyfile(SAMPLE_RUN, run)
    kept = ReplayCache(run, tmp_path / "cache")
    kept.put("scheduler-check 1 at 1200", 0.5)
    assert ReplayCache(run, tmp_path / "cache").get("scheduler-check 1 at 1200") == 0.5
    assert ReplayCache(run, tmp_path / "cache").get("scheduler-check 1 at 2400") is None
    assert (tmp_path / "cache").stat().st_mode & 0o777 == 0o700  # the user's own, as runs are
    with run.open("ab") as stream:
        stream.write(b"\0")
    assert ReplayCache(run, tmp_path / "cache").get("scheduler-check 1 at 1200") is None


def test_a_cache_folder_that_cannot_be_written_is_no_error(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    cache = ReplayCache(SAMPLE_RUN, blocked / "cache")
    cache.put("cpu-tier", {"lru": 1})
    assert cache.get("cpu-tier") is None


class _HiddenVllm:
    """A meta-path finder that hides vLLM, as an environment without it."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.split(".", maxsplit=1)[0] == "vllm":
            raise ImportError(f"No module named {name!r} (hidden by the test)")


def test_without_vllm_nothing_is_kept_or_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ReplayCache(SAMPLE_RUN, tmp_path).put("cpu-tier", {"lru": 1})
    monkeypatch.setattr(sys, "meta_path", [_HiddenVllm(), *sys.meta_path])
    monkeypatch.delitem(sys.modules, "vllm", raising=False)  # as if never imported here
    # The rules then say they need vLLM, rather than quote replays it cannot run here.
    assert ReplayCache(SAMPLE_RUN, tmp_path).get("cpu-tier") is None
