"""The advice `kvscope advise` keeps in the run file (collector/advisor/stored.py): what it
printed, read back by the next advise, the Advisor page and the health scorecard without a
replay; never served to a run whose content changed or to another kvscope; kept in the cache
folder where the run file cannot be written."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from collector.advisor import RunContext, stored
from collector.advisor.replay_cache import ReplayCache, code_digest, vllm_version
from collector.advisor.stored import assumptions, current_result, default_assumptions, keep, lookup
from collector.cli import main
from collector.health.scorecard import scorecard
from collector.health.thresholds import DEFAULTS, load_thresholds
from collector.model.kv_memory import DEFAULT_GPU_GIB, DEFAULT_MODEL, MODELS, GpuMemory
from collector.store.run_file import RunFile, RunStore
from collector.store.run_opening import open_checked
from collector.store.stored_advice import read_advice, write_advice
from tests.support.app import go_to, start
from tests.support.repo import SAMPLE_RUN, SAMPLE_TRACE

Advised = tuple[Path, dict[str, Any], str]


def advise(*arguments: str) -> tuple[str, str]:
    """`kvscope advise ARGUMENTS` in this process: what it printed, and its progress."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["advise", *arguments]) == 0
    return out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def advised(tmp_path_factory: pytest.TempPathFactory) -> Advised:
    """A copy of the sample advised once (nothing kept before: every rule and replay ran)."""
    folder = tmp_path_factory.mktemp("advised")
    run = folder / "run.duckdb"
    shutil.copyfile(SAMPLE_RUN, run)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KVSCOPE_CACHE_DIR", str(folder / "cache"))
        printed, progress = advise(str(run), "--json")
    return run, json.loads(printed), progress


def copy_of(run: Path, folder: Path) -> Path:
    copy = folder / "copy.duckdb"
    shutil.copyfile(run, copy)
    return copy


def test_advise_keeps_what_it_printed_in_the_run_file(advised: Advised) -> None:
    run, document, progress = advised
    assert "[1/14] cache-size: fired" in progress  # worked out, not read
    last = progress.splitlines()[-1]
    assert last == "the advice kept in the run file, for the app and the health scorecard"
    with RunFile.open(run) as opened:
        kept = current_result(opened)
    assert kept is not None
    assert kept["document"] == document
    assert kept["inputs"]["code"] == code_digest()
    assert kept["inputs"]["assumptions"] == default_assumptions()
    assert kept["curves"]["series"][0]["name"] == "block size 16 (this run)"
    with RunFile.open(SAMPLE_RUN) as sample:  # the tests leave the committed sample alone
        assert read_advice(sample) is None


def test_a_second_advise_reads_it_and_prints_the_same(
    advised: Advised, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, document, _ = advised
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(tmp_path))  # empty: nothing to replay from
    printed, progress = advise(str(run), "--json")
    assert json.loads(printed) == document
    assert progress.splitlines()[1].startswith("  the advice worked out at ")
    assert "[1/14]" not in progress
    markdown, _ = advise(str(run))
    top = document["suggestions"][0]
    assert f"## 1. {top['title']}\n" in markdown
    assert f"Do this: {top['action']}\n" in markdown
    assert list(tmp_path.iterdir()) == []  # no replay ran, nothing else was kept


def test_a_changed_run_is_not_served_the_advice_of_before(
    advised: Advised, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(tmp_path))
    run, _, _ = advised
    same = copy_of(run, tmp_path)
    with RunFile.open(same) as opened:  # another path, the same rows: still this run's
        assert current_result(opened) is not None
    # As a collector resuming the run would: one row more in its meta table.
    store = RunStore(open_checked(same, read_only=False), same)
    store.note_capture_stopped("engine-0", 0, "stopped by the test")
    store.close()
    with RunFile.open(same) as opened:
        assert read_advice(opened) is not None  # still there, but not this content's
        assert current_result(opened) is None
        context = RunContext(opened, same, MODELS[DEFAULT_MODEL], GpuMemory(DEFAULT_GPU_GIB))
        assert lookup(context) is None
        line = scorecard(opened, load_thresholds(DEFAULTS))[-1]
    assert line.status == "grey"
    assert f"`kvscope advise {same}` works it out" in line.sentence


def test_another_kvscope_is_not_served_the_advice(
    advised: Advised, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(tmp_path))
    run, _, _ = advised
    copy = copy_of(run, tmp_path)
    with RunFile.open(copy) as opened:
        kept = current_result(opened)
    assert kept is not None
    other = {**kept, "inputs": {**kept["inputs"], "code": "0" * 32}}
    assert write_advice(copy, json.dumps(other)) is None
    with RunFile.open(copy) as opened:
        assert current_result(opened) is None


def test_the_apps_own_environment_is_served_the_advice_kept_with_vllm(
    advised: Advised, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`.ci/setup --app` makes an environment of kvscope without vLLM, where the rules cannot
    replay the run through vLLM: the advice a replay or an advise kept with vLLM is served
    there, to the scorecard and the Advisor page; another vLLM than the one it was worked
    out with is still not served it."""
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(tmp_path))
    run, document, _ = advised
    copy = copy_of(run, tmp_path)
    with RunFile.open(copy) as opened:
        kept = current_result(opened)
    assert kept is not None and kept["inputs"]["vllm"] == vllm_version() is not None
    # This environment's answer where vLLM is not installed (`.venv-app`'s, checked by hand).
    monkeypatch.setattr(stored, "vllm_version", lambda: None)
    with RunFile.open(copy) as opened:
        assert current_result(opened) == kept
        line = scorecard(opened, load_thresholds(DEFAULTS))[-1]
        served = lookup(RunContext(opened, copy, MODELS[DEFAULT_MODEL], GpuMemory(DEFAULT_GPU_GIB)))
    assert line.sentence.startswith(f"{document['suggestions'][0]['title']}: predicted ")
    assert served is not None and served["document"] == {**document, "run": str(copy)}
    monkeypatch.setattr(stored, "vllm_version", lambda: "0.33.0")
    with RunFile.open(copy) as opened:
        assert current_result(opened) is None


def test_a_run_held_open_keeps_it_in_the_cache_folder(
    advised: Advised, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    run, document, _ = advised
    with RunFile.open(run) as opened:
        kept = current_result(opened)
    assert kept is not None
    fresh = tmp_path / "fresh.duckdb"
    shutil.copyfile(SAMPLE_RUN, fresh)  # no advice in it
    with RunFile.open(fresh) as held:  # as the app holds the run it shows
        where = keep(kept, fresh, lambda: ReplayCache(fresh), in_run=True)
        assert where.startswith("the advice kept in kvscope's cache folder: the run file could")
        assert read_advice(held) is None
        context = RunContext(held, fresh, MODELS[DEFAULT_MODEL], GpuMemory(DEFAULT_GPU_GIB))
        assert assumptions(context) == default_assumptions()
        served = lookup(context)
        assert current_result(held) is not None  # the scorecard reads the cache folder too
    assert served is not None
    assert served["document"] == {**document, "run": str(fresh)}


def test_the_overview_and_the_advisor_page_show_it(
    advised: Advised, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(tmp_path))  # empty: the run file's advice
    run, document, _ = advised
    top = document["suggestions"][0]
    with RunFile.open(run) as opened:
        line = scorecard(opened, load_thresholds(DEFAULTS))[-1]
        prompt_tokens = RunContext(opened, run).summary["prompt_tokens"]
    assert line.name == "Advisor's top action"
    assert top["gain_tokens"] / prompt_tokens >= 0.01  # the sample's: 11.5 %
    assert line.status == "amber"
    assert line.sentence.startswith(
        f"{top['title']}: predicted {top['gain_tokens']:,.0f} more prompt tokens hit "
    )
    assert f"Do this: {top['action']}" in line.sentence
    app = start(run)
    (shown,) = [item.value for item in app.markdown if "**Advisor's top action.**" in item.value]
    assert shown.startswith(":orange-badge[look] **Advisor's top action.** Grow the KV cache to ")
    page = go_to(app, "views/advisor.py")
    titles = [f"{entry['rank']}. {entry['title']}" for entry in document["suggestions"]]
    assert [subheader.value for subheader in page.subheader] == [*titles, "Checks"]
    assert list(tmp_path.iterdir()) == []  # the page replayed nothing and kept nothing


def replay(*arguments: str) -> tuple[str, str]:
    """`kvscope replay ARGUMENTS` in this process: what it printed, and its progress."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["replay", *arguments]) == 0
    return out.getvalue(), err.getvalue()


def test_replay_keeps_the_advice_at_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kvscope replay` works out the advice at its end and keeps it in the run: the next
    advise reads it, and prints what a replay told --no-advise gets worked out afresh."""
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    trace = ["--limit", "200", "--num-blocks", "300"]
    advised, bare = tmp_path / "advised.duckdb", tmp_path / "bare.duckdb"
    printed, progress = replay(str(SAMPLE_TRACE), "--out", str(advised), *trace)
    assert "[14/14] hybrid-alignment" in progress  # every rule ran, as `kvscope advise` runs them
    assert "the advice kept in the run file, for the app and the health scorecard" in printed
    _, quiet = replay(str(SAMPLE_TRACE), "--out", str(bare), *trace, "--no-advise", "--quiet")
    assert quiet == ""
    with RunFile.open(bare) as opened:
        assert read_advice(opened) is None

    read, read_progress = advise(str(advised), "--json")
    assert "for this run and code, read" in read_progress
    assert "[1/14]" not in read_progress  # nothing worked out again
    fresh, _ = advise(str(bare), "--json", "--no-store")
    kept, afresh = json.loads(read), json.loads(fresh)
    assert kept["suggestions"]  # the slice fires rules: the comparison compares something
    assert {**kept, "run": None} == {**afresh, "run": None}
