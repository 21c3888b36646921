"""`kvscope explain`: the sample run's miss breakdown as text and JSON equals the run's
`cause_totals` and adds up to its prompt tokens; one request's evicted blocks name who evicted
them and when; each bad input is refused with one line and exit 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import duckdb
import pytest

from collector.cli import main
from collector.model.family_names import family_name
from collector.queries.miss_causes import CAUSE_NAMES, CAUSES, cause_totals, lookup_causes
from collector.replay.block_manager import CacheSettings
from collector.store.run_file import RunFile
from collector.vllm_kv.conflicts import HashConflictDetector
from collector.vllm_kv.ingest import append_vllm_batches
from tests.support.repo import SAMPLE_RUN
from tests.support.runs import evictions_run
from tests.support.vllm_kv_pipeline import H, events_run, received, stored


def explain(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["explain", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def totals() -> dict[str, int]:
    with RunFile.open(SAMPLE_RUN) as run:
        frame = cause_totals(run)
    return dict(zip(frame["cause"], frame["tokens"].astype(int), strict=True))


def sample_prompt_tokens() -> int:
    """The prompt tokens of the sample's lookups, counted from its lookup records."""
    with RunFile.open(SAMPLE_RUN) as run:
        row = run.row("SELECT sum(num_prompt_tokens) FROM events WHERE kind = 'lookup'")
    assert row is not None
    return int(row[0])


def test_the_json_totals_are_the_runs_and_add_up_to_its_prompt_tokens(
    capsys: pytest.CaptureFixture[str], totals: dict[str, int]
) -> None:
    code, out, err = explain(capsys, str(SAMPLE_RUN), "--json")
    assert (code, err) == (0, "")
    document = json.loads(out)
    assert [cause["cause"] for cause in document["causes"]] == list(CAUSES)
    assert {cause["cause"]: cause["tokens"] for cause in document["causes"]} == totals
    assert document["prompt_tokens"] == sum(totals.values()) == sample_prompt_tokens()
    assert sum(cause["share"] for cause in document["causes"]) == pytest.approx(1.0)
    assert document["lookups"] == 501
    assert document["unexplained"] == []  # the sample recorded token ids
    # The dynamic field the advisor names behind part of the diverged tokens: the report
    # requests' prompts differ at tokens 20-28 (a report id), which cost them 34,224 tokens.
    assert document["dynamic_fields"] == [
        {"label": "report-*", "requests": 60, "start": 20, "end": 28, "diverged_tokens": 34_224}
    ]
    assert totals["diverged"] >= 34_224
    families = document["families"]
    assert len(families) == 5
    assert [family["missed_tokens"] for family in families] == sorted(
        (family["missed_tokens"] for family in families), reverse=True
    )
    for family in families:  # named by the first words of its text, as every page names it
        assert family["text"]  # its first block's text: the sample recorded token ids
        assert family["name"] == family_name(
            family["text"], family["owner"], None, family["adapter"]
        )
        assert family["family"][:8] not in family["name"]
        assert sum(cause["tokens"] for cause in family["causes"]) == family["missed_tokens"]


def test_the_text_leads_with_the_hit_and_lists_each_cause_as_the_run_counts_it(
    capsys: pytest.CaptureFixture[str], totals: dict[str, int]
) -> None:
    code, out, err = explain(capsys, str(SAMPLE_RUN))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    prompt_tokens = sum(totals.values())
    assert (
        lines[0] == f"kvscope explain {SAMPLE_RUN}: {prompt_tokens:,} prompt tokens in 501 lookups"
    )
    assert lines[1] == (
        "53.6 % of the prompt tokens hit; the largest miss cause: diverged from a cached "
        "prefix, 26.9 % (133,552 tokens)"
    )
    table = lines[3 : lines.index("", 3)]
    fields = lines.index("", 3) + 1
    assert lines[fields].startswith("diverged at a dynamic field (`kvscope advise`")
    assert lines[fields + 1].strip() == (
        "34,224 tokens of the report-* requests (60): their prompts differ at tokens 20-28"
    )
    assert table[0].split() == ["cause", "tokens", "share", "lookups"]
    rows = table[1:-1]
    assert [row.split("  ")[0] for row in rows] == [
        CAUSE_NAMES[cause] for cause in CAUSES if totals[cause] or cause == "hit"
    ]  # the hit first, the causes in their order, none without tokens
    shown = {CAUSE_NAMES[cause]: tokens for cause, tokens in totals.items() if tokens}
    for row in rows:
        name = row.split("  ")[0]
        assert row.split()[len(name.split())] == f"{shown[name]:,}"
    assert table[-1].split()[:4] == ["all", "prompt", "tokens", f"{prompt_tokens:,}"]
    assert "unexplained: none, every missed token has its cause" in lines
    families = lines[lines.index("unexplained: none, every missed token has its cause") + 2 :]
    assert families[0].startswith("the 5 prefix families that missed most tokens")
    # named by its first words, as the app names it (the hash 9ae5f786... is not the name)
    assert families[1].strip().startswith("“You are Initech's internal help desk assist…”")
    assert "lost to diverged from a cached prefix 32,608, evicted 27,648" in families[1]
    assert families[2].strip() == (
        'its first block: "You are Initech\'s internal help desk assistant for employees. You"'
    )


def test_a_request_with_an_evicted_block_names_its_evictor_on_the_sample(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with RunFile.open(SAMPLE_RUN) as run:
        causes = lookup_causes(run)
    evicted = causes[causes["cause"] == "evicted"].iloc[0]
    request, evictor = str(evicted["request_id"]), str(evicted["evicted_by"])
    code, out, err = explain(capsys, str(SAMPLE_RUN), "--request", request, "--json")
    assert (code, err) == (0, "")
    document = json.loads(out)
    (lookup,) = document["lookups"]
    blocks = [block for block in lookup["blocks"] if block["cause"] == "evicted"]
    assert len(blocks) == int(evicted["blocks"])
    first = blocks[0]
    assert first["position"] == int(evicted["first_position"])
    assert first["details"]["evicted_by"] == evictor
    assert first["details"]["evicted_by_tenant"] == evicted["evicted_by_tenant"]
    assert first["details"]["evicted_ago_s"] == int(evicted["evicted_ago_ns"]) / 1e9
    assert first["text"]  # the sample recorded token ids, and its tokenizer is installed
    assert sum(cause["tokens"] for cause in lookup["causes"]) == lookup["prompt_tokens"]

    code, out, err = explain(capsys, str(SAMPLE_RUN), "--request", request)
    assert (code, err) == (0, "")
    assert f"evicted: by request {evictor} (tenant {evicted['evicted_by_tenant']})" in out


def test_a_hand_built_eviction_says_who_and_how_long_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """tests/support/runs.py EVICTIONS: z0 (tenant y) evicts x's first block, 10 ms before
    x1 looks it up; x1's 8 tokens are that block and its partial tail."""
    run = evictions_run(tmp_path)
    code, out, err = explain(capsys, str(run), "--request", "x1")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == (
        f"request x1 (tenant x) in {run}: 8 prompt tokens, block size 4, 0 preemptions"
    )
    assert lines[1] == (
        "(no prompt text: the run did not record token ids; replay with --record-token-ids)"
    )
    assert lines[3] == "lookup at 0.030 s on engine - rank 0: 8 prompt tokens"
    assert lines[4].split()[:3] == ["evicted", "4", "tokens"]
    assert lines[4].endswith("10 ms before the lookup")
    assert "by request z0 (tenant y, prefix family " in lines[4]
    assert lines[5].split() == ["partial", "last", "block", "4", "tokens"]
    assert lines[6] == "  missed blocks:"
    assert lines[7] == "    block 0: evicted: by request z0 (tenant y), 10 ms before the lookup"


def _old_schema(path: Path) -> None:
    with duckdb.connect(str(path)) as connection:
        connection.execute("UPDATE meta SET value = '8' WHERE key = 'schema_version'")


def _no_table(path: Path) -> None:
    """A run of schema version 9 made before its miss causes were stored (in a current
    version's run a missing table is damage, and said so)."""
    with duckdb.connect(str(path)) as connection:
        connection.execute("DROP TABLE lookup_causes")
        connection.execute("UPDATE meta SET value = '9' WHERE key = 'schema_version'")


def _damaged(path: Path) -> None:
    with duckdb.connect(str(path)) as connection:
        connection.execute("DROP TABLE lookup_causes")


def _truncated(path: Path) -> None:
    with path.open("r+b") as handle:
        handle.truncate(100_000)


BAD_RUNS: dict[str, tuple[Any, str]] = {
    "garbage bytes": (None, "not a DuckDB file, so not a kvscope run"),
    "truncated": (_truncated, "the run file is damaged: 100,000 bytes"),
    "older schema": (
        _old_schema,
        "the run predates miss causes (its schema version is 8, and they came with version 9): "
        "replay its trace again",
    ),
    "no lookup_causes": (
        _no_table,
        "the run predates miss causes (it lacks their table, lookup_causes): replay its trace",
    ),
    "current without lookup_causes": (
        _damaged,
        "the run file is damaged: tables missing: lookup_causes",
    ),
    "missing": (None, "no such run file"),
}


@pytest.mark.parametrize("case", sorted(BAD_RUNS))
def test_a_bad_run_is_refused_in_one_line_naming_it(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    damage, reason = BAD_RUNS[case]
    path = tmp_path / "run.duckdb"
    if case == "garbage bytes":
        path.write_bytes(bytes(range(256)) * 64)
    elif damage is not None:
        shutil.copy(SAMPLE_RUN, path)
        damage(path)
    code, out, err = explain(capsys, str(path), "--request", "rag-153")
    assert (code, out) == (2, "")
    assert err.count("\n") == 1
    assert err.startswith(f"kvscope: error: {path}: {reason}")


def test_no_such_request_is_refused_naming_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = explain(capsys, str(SAMPLE_RUN), "--request", "no-such\x1b[2J", "--json")
    assert (code, out) == (2, "")
    assert err == f'kvscope: error: {SAMPLE_RUN}: no request "no-such\\x1b[2J" in this run\n'


def test_a_run_of_vllm_kv_events_alone_has_no_lookups_to_explain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "events.duckdb"
    run = events_run(path, CacheSettings(4, 5))
    append_vllm_batches(run, [received(0, stored(H, [1, 2, 3, 4]))], [], HashConflictDetector())
    run.finalize()
    run.close()
    code, out, err = explain(capsys, str(path))
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"kvscope explain {path}: 0 prompt tokens in 0 lookups",
        "no lookups: a run of vLLM's KV events alone has no requests, so no miss causes",
    ]
    code, out, err = explain(capsys, str(path), "--json")
    document = json.loads(out)
    assert (document["prompt_tokens"], document["families"], document["unexplained"]) == (0, [], [])
