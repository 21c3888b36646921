"""A name the user gives a prefix family (`kvscope names RUN --family KEY=NAME`): found by
what the app and `kvscope explain` show of it (its label, a request id, its hash), kept in the
run file or else the user's file, and shown in place of its tenant and first request on every
page; bad keys and names refused in one line with nothing written. On copies of the hybrid
sample, which recorded no token ids: its families are named by tenant and request today."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from collector.cli import main
from collector.model.family_names import family_name, name_problem
from collector.store.run_file import RunFile
from collector.store.stored_advice import content_digest
from tests.support.app import go_to, start
from tests.support.repo import SAMPLE_HYBRID_RUN, SAMPLE_RUN

# The hybrid sample's families that missed most tokens, as named today.
RAG_80 = ("9ae5f786feabb3a2", "initech · request rag-80")
RAG_39 = ("a51b3f6977b39a32", "acme · request rag-39")
RAG_133 = ("b4904b3cb844fa75", "globex · request rag-133")


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the hybrid sample, and a user's configuration folder of this test's own."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    copy = tmp_path / "run.duckdb"
    shutil.copy(SAMPLE_HYBRID_RUN, copy)
    return copy


def explained_names(run: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """Each family `kvscope explain` lists, hash to name."""
    capsys.readouterr()
    assert main(["explain", str(run), "--json"]) == 0
    families = json.loads(capsys.readouterr().out)["families"]
    return {family["family"]: family["name"] for family in families}


def kept_in_run(run: Path) -> dict[str, str] | None:
    with RunFile.open(run) as opened:
        row = opened.row("SELECT value FROM meta WHERE key = 'family_names'")
    return None if row is None else json.loads(row[0])


def test_a_family_is_named_by_its_request_label_or_hash(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert explained_names(run, capsys)[RAG_80[0]] == RAG_80[1]
    with RunFile.open(run) as opened:
        digest = content_digest(opened)
    arguments = ["--family", "rag-80=Nightly RAG", "--family", f"{RAG_39[1]}=Acme search"]
    assert main(["names", str(run), *arguments, "--family", "b4904b3c=Globex RAG"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"family {RAG_80[0]} ({RAG_80[1]}) named Nightly RAG"
    assert out[-1] == f"3 named, 0 forgotten, in the run file {run}"
    assert kept_in_run(run) == {
        RAG_80[0]: "Nightly RAG",
        RAG_39[0]: "Acme search",
        RAG_133[0]: "Globex RAG",
    }
    names = explained_names(run, capsys)
    assert [names[family] for family, _ in (RAG_80, RAG_39, RAG_133)] == [
        "Nightly RAG",
        "Acme search",
        "Globex RAG",
    ]
    # Another name for a family replaces its own and keeps the others; the advice stays.
    assert main(["names", str(run), "--family", f"{RAG_80[0]}=Initech RAG"]) == 0
    assert explained_names(run, capsys)[RAG_80[0]] == "Initech RAG"
    assert kept_in_run(run)[RAG_39[0]] == "Acme search"  # type: ignore[index]
    with RunFile.open(run) as opened:
        assert content_digest(opened) == digest


def test_a_file_of_names_and_a_dataset_go_to_the_users_file(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = tmp_path / "dataset"
    assert main(["export", str(run), "--parquet", str(dataset)]) == 0
    names = tmp_path / "names.csv"
    names.write_text(f'rag-133,Globex RAG\n\n{RAG_39[0]},"Acme, search"\n')
    capsys.readouterr()
    assert main(["names", str(dataset), "--families", str(names)]) == 0
    user_file = tmp_path / "config" / "kvscope" / "family-names.csv"
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"2 named, 0 forgotten, in {user_file} (a Parquet dataset is not written to)"
    )
    assert user_file.read_text() == f'{RAG_39[0]},"Acme, search"\n{RAG_133[0]},Globex RAG\n'
    assert explained_names(dataset, capsys)[RAG_133[0]] == "Globex RAG"
    # The user's file names the same hashes in any run; the run's own names win.
    assert main(["names", str(run), "--family", "rag-133=Globex search"]) == 0
    names_in_run = explained_names(run, capsys)
    assert names_in_run[RAG_133[0]] == "Globex search"
    assert names_in_run[RAG_39[0]] == "Acme, search"
    assert kept_in_run(run) == {RAG_133[0]: "Globex search"}
    # A dataset exported from a named run keeps its names.
    (tmp_path / "config" / "kvscope" / "family-names.csv").unlink()
    assert main(["export", str(run), "--parquet", str(tmp_path / "named")]) == 0
    assert explained_names(tmp_path / "named", capsys)[RAG_133[0]] == "Globex search"
    # Its names are the run's own: a dataset cannot forget them, and says so.
    assert main(["names", str(tmp_path / "named"), "--forget", "Globex search"]) == 2
    assert capsys.readouterr().err == (
        f"kvscope: error: {tmp_path / 'named'}: its own names cannot be forgotten: "
        "a Parquet dataset is not written to\n"
    )


def test_a_name_is_forgotten_in_the_run_and_the_users_file(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["names", str(run), "--family", "rag-80=Nightly RAG"]) == 0
    assert main(["names", str(run), "--family", "rag-39=Acme search", "--keep-in", "user"]) == 0
    capsys.readouterr()
    assert main(["names", str(run), "--forget", "Nightly RAG", "--forget", RAG_39[0]]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"family {RAG_80[0]} (Nightly RAG): its name forgotten"
    assert out[-1].startswith(f"0 named, 2 forgotten, in the run file {run} and ")
    assert kept_in_run(run) == {}
    assert (tmp_path / "config" / "kvscope" / "family-names.csv").read_text() == ""
    names = explained_names(run, capsys)
    assert (names[RAG_80[0]], names[RAG_39[0]]) == (RAG_80[1], RAG_39[1])


@pytest.mark.parametrize(
    ("family", "reason"),
    [
        ("nobody=X", "no prefix family of run.duckdb is known as nobody"),
        ("rag-80=", "the name is empty"),
        ("rag-80=" + "x" * 61, "the name is 61 characters, more than 60"),
        ("rag-80=a\x1b[31mb", "the name holds a control or unprintable character"),
        ("rag-80=<a href=x>y</a>", "the name holds < or >"),
        ("rag-80=9ae5f786feabb3a2", "the name reads as a hash"),
        ("rag-80", "not KEY=NAME"),
        ("9ae5=X", "no prefix family of run.duckdb is known as 9ae5"),
    ],
)
def test_a_bad_key_or_name_is_refused_and_nothing_written(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], family: str, reason: str
) -> None:
    good = ["--family", "rag-39=Acme search"]  # written only if every one is good
    assert main(["names", str(run), *good, "--family", family]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    assert line.startswith("kvscope: error: --family ") and reason in line, line
    assert kept_in_run(run) is None
    assert not (tmp_path / "config").exists()


def test_a_bad_file_of_names_is_refused(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    names = tmp_path / "names.csv"
    names.write_text("rag-80,Nightly RAG\nrag-39\n")
    assert main(["names", str(run), "--families", str(names)]) == 2
    assert capsys.readouterr().err == f"kvscope: error: {names}: line 2: not KEY,NAME\n"
    assert main(["names", str(run)]) == 2
    assert "give --names FILE, --family KEY=NAME, --families FILE or --forget KEY" in (
        capsys.readouterr().err
    )
    assert kept_in_run(run) is None


def test_naming_a_family_with_prompt_text_says_its_text_comes_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    run = tmp_path / "run.duckdb"
    shutil.copy(SAMPLE_RUN, run)  # recorded token ids
    assert main(["names", str(run), "--family", "rag-80=Nightly RAG"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        f"family {RAG_80[0]} ({RAG_80[1]}) named Nightly RAG "
        "(its prompt text names it where a tokenizer reads it)"
    )


def test_the_name_comes_after_text_and_before_tenant_and_request() -> None:
    assert family_name("You are a helpful assistant", "acme", "r-1", given="Support") == (
        "“You are a helpful assistant”"
    )
    assert family_name(None, "acme", "r-1", "sql", given="Support") == "Support (adapter sql)"
    assert family_name(None, "acme", "r-1") == "acme · request r-1"
    # A name that breaks the rules (a hand-edited file) is never shown.
    assert family_name(None, "acme", "r-1", given="<b>x</b>") == "acme · request r-1"
    assert name_problem("Nightly RAG, 2026-12-01") is None


def chart_traces(app: AppTest) -> str:
    """The page's charts' traces (labels, hovers, values) as one text."""
    specs = [json.loads(chart.proto.spec) for chart in app.get("plotly_chart")]
    return json.dumps([trace for spec in specs for trace in spec["data"]], ensure_ascii=False)


@pytest.mark.parametrize("page", ["views/overview.py", "views/hotspots.py"])
def test_the_pages_show_the_given_name(run: Path, page: str) -> None:
    assert main(["names", str(run), "--family", "rag-80=Nightly RAG"]) == 0
    app = go_to(start(run, timeout_s=180), page)
    traces = chart_traces(app)
    assert "Nightly RAG" in traces
    assert RAG_80[1] not in traces
    assert RAG_39[1] in traces  # the families not named keep their tenant and request
    if page == "views/overview.py":  # and it says how to name them
        assert any(f"kvscope names {run} --family KEY=NAME" in c.value for c in app.caption)
