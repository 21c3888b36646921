"""Every string a run holds from its engine or trace is untrusted text: tenants, adapters,
request and engine ids, the hash algorithm and vLLM version an engine reports, model names,
file names. A run whose strings hold Markdown links and images, HTML, pipes, backticks, the
end of a CDATA section, control characters and terminal escapes still gives valid JUnit XML,
an intact report.md, an HTML report and charts with no markup of theirs, a clean terminal
(report, summary, advise) and an Advisor page that shows them as text (collector/safe_text.py
escapes for every output)."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path
from xml.etree import ElementTree

import duckdb
import pytest

from collector.cli import main
from collector.report.figures import read_run
from collector.report.html import comparison_figures
from collector.report.thresholds import load_thresholds
from collector.report.verdict import compare
from tests.support.app import go_to, start
from tests.support.repo import SAMPLE_TRACE

pytestmark = pytest.mark.slow

HOSTILE = {
    "acme": "![pixel](http://127.0.0.1:9/p.png)",
    "globex": "a|b <script>alert(1)</script>",
    "initech": "`tick` [link](http://127.0.0.1:9/)",
}
CONTROL = "\x01\x1b[31m\nnext"
CODE_SPAN = re.compile(r"`[^`]*`")


def hostile_run(folder: Path) -> Path:
    """The sample workload replayed with hostile tenant and adapter names, then control
    characters written into the stored names (as an old or forged run file could hold)."""
    lines = []
    with gzip.open(SAMPLE_TRACE, "rt") as handle:
        for index, text in enumerate(list(handle)[:200]):
            row = json.loads(text)
            if row.get("tenant") in HOSTILE:
                row["tenant"] = HOSTILE[row["tenant"]]
            if row.get("tenant") == HOSTILE["acme"] and index % 3 == 0:
                row["tenant"] = HOSTILE["globex"]  # reads acme's blocks: cross-tenant advice
            if row.get("lora"):
                row["lora"] = "lora](http://127.0.0.1:9/)"
            lines.append(json.dumps(row))
    trace = folder / "trace.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    run = folder / "run.duckdb"
    assert main(["replay", str(trace), "--out", str(run), "--reveal-tenants", "--quiet"]) == 0
    with duckdb.connect(str(run)) as connection:
        tables = connection.execute(
            "SELECT DISTINCT table_name FROM information_schema.columns"
            " WHERE column_name = 'tenant'"
        ).fetchall()
        for (table,) in tables:
            connection.execute(
                f"UPDATE {table} SET tenant = tenant || ? WHERE tenant = ?",
                [CONTROL, HOSTILE["acme"]],
            )
    return run


def outside_code_spans(text: str) -> str:
    return CODE_SPAN.sub("", text)


def assert_no_control_characters(text: str) -> None:
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", text), "a control character got through"


def assert_inert(text: str) -> None:
    """No live link, image or HTML outside code spans, no control characters."""
    assert_no_control_characters(text)
    plain = outside_code_spans(text)
    assert "](http" not in plain and "<script>" not in plain


def test_reports_terminal_and_advisor_are_safe_for_any_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = hostile_run(tmp_path)
    capsys.readouterr()
    out = tmp_path / "report"
    code = main(["report", "--baseline", str(run), "--candidate", str(run), "--out-dir", str(out)])
    assert code == 0
    terminal = capsys.readouterr().out
    assert_no_control_characters(terminal)
    assert "tenant_hit_ratio[" in terminal

    junit = ElementTree.parse(out / "junit.xml").getroot()  # valid XML
    names = [case.get("name") or "" for case in junit.iter("testcase")]
    assert any(r"\x01\x1b[31m\nnext" in name for name in names), names

    markdown = (out / "report.md").read_text()
    assert_inert(markdown)
    rows = [line for line in markdown.splitlines() if line.startswith("|")]
    cells = {len(re.findall(r"(?<!\\)\|", outside_code_spans(row))) for row in rows[:2]}
    for row in rows:
        if row.startswith("| ✅") or row.startswith("| ❌") or "tenant_hit_ratio" in row:
            assert len(re.findall(r"(?<!\\)\|", CODE_SPAN.sub("x", row))) in cells, row

    assert main(["advise", str(run)]) == 0
    advice = capsys.readouterr().out
    assert_inert(advice)
    assert "](http" in advice, "the names are shown, as code"

    app = go_to(start(run), "views/advisor.py")
    shown = "\n".join(element.value for element in [*app.markdown, *app.caption])
    assert_inert(shown)


# Into every string a run holds that an engine or a trace sets: links and images, HTML that
# runs script, a pipe, backticks, the end of an XML CDATA section, a terminal escape, a bell
# and a newline. File names hold the same but a slash.
INJECTED = (
    "![i](http://127.0.0.1:9/i.png) [l](http://127.0.0.1:9/) <img src=x onerror=alert(1)> "
    "a|b `t` ]]> \x1b[31m\x07\x9b\u2028\nnext"
)
FILE_NAME = "x\x1b[2J<img src=x onerror=alert(1)> [l](javascript:alert(1)) a|b `t` ]]>"
RUN_STRINGS = ("run_id", "trace", "timing", "hash_algo", "vllm_version", "kvscope_version")
# What a live run's options name (collector/commands/collect.py) and a replay's tokenizer.
OPTION_STRINGS = ("engine_id", "endpoint", "model", "tokenizer", "trace_format", "router")
# Request and engine ids, wherever a run holds them (joins still match: each gets the same).
ID_COLUMNS = ("request_id", "stored_by", "first_stored_by", "engine_id", "engine")
CONTROL_CHARACTER = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")
KNOWN_MARKUP = ("<!-- kvscope-report -->", "<details><summary>", "</summary>", "</details>")
SCRIPT = re.compile(r"<script[^>]*>.*?</script>", re.DOTALL)
SAFE_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "code"}
SAFE_TAGS |= {"table", "tr", "th", "td", "br", "b", "ul", "li", "div", "script"}


def forged_run(folder: Path) -> Path:
    """A two-engine replay of the sample's first 200 requests into a pool small enough for
    the advisor's rules to fire (token ids recorded), from a trace whose file name is
    hostile, with INJECTED then written into every string the run holds from its engine or
    trace (as a live engine's header sets the hash and version, or a forged file holds)."""
    trace = folder / f"{FILE_NAME}.jsonl"
    with gzip.open(SAMPLE_TRACE, "rt") as handle:
        trace.write_text("".join(list(handle)[:200]))
    run = folder / f"{FILE_NAME} baseline.duckdb"
    replay = ["replay", str(trace), "--out", str(run), "--engines", "2", "--num-blocks", "150"]
    assert main([*replay, "--reveal-tenants", "--record-token-ids", "--quiet"]) == 0
    with duckdb.connect(str(run)) as connection:
        (stored,) = connection.execute("SELECT options FROM runs").fetchall()[0]
        options = json.loads(stored)
        options.update({name: f"{INJECTED} {name}" for name in OPTION_STRINGS})
        assignments = ", ".join(f"{column} = {column} || ?" for column in RUN_STRINGS)
        connection.execute(
            f"UPDATE runs SET {assignments}, options = ?",
            [*[INJECTED] * len(RUN_STRINGS), json.dumps(options)],
        )
        columns = connection.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE data_type = 'VARCHAR' AND table_name <> 'runs'"
        ).fetchall()
        for table, column in columns:
            if column in ID_COLUMNS or column in ("tenant", "lora"):
                connection.execute(
                    f"UPDATE {table} SET {column} = {column} || ? WHERE {column} <> ''",
                    [INJECTED],
                )
    return run


def variant(run: Path, name: str, change: str) -> Path:
    """A copy of `run` with one UPDATE of its runs row."""
    copy = run.with_name(run.name.replace("baseline", name))
    shutil.copyfile(run, copy)
    with duckdb.connect(str(copy)) as connection:
        connection.execute(f"UPDATE runs SET {change}")
    return copy


def assert_safe_markdown(text: str) -> None:
    """No control character; outside code spans no link, image, HTML or stray backtick; every
    table row keeps its header's cells."""
    assert not CONTROL_CHARACTER.search(text), CONTROL_CHARACTER.search(text)
    plain = outside_code_spans(text)
    for markup in KNOWN_MARKUP:
        plain = plain.replace(markup, "")
    assert not re.search(r"(?<!\\)\]\(", plain), "a live link or image"
    assert not re.search(r"(?<!\\)[<`]", plain), "raw HTML or a stray backtick"
    header_cells = 0
    for line in text.splitlines():
        if not line.startswith("|"):
            header_cells = 0
            continue
        cells = len(re.findall(r"(?<!\\)\|", CODE_SPAN.sub("x", line)))
        header_cells = header_cells or cells
        assert cells == header_cells, line


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))


def assert_safe_html(text: str) -> None:
    """Only the report's own tags, no event-handler attribute; no escape anywhere, no control
    character outside the scripts (plotly.js holds a few, and the charts' data is JSON)."""
    assert "\x1b" not in text
    markup = SCRIPT.sub("<script></script>", text)
    assert not CONTROL_CHARACTER.search(markup), CONTROL_CHARACTER.search(markup)
    parser = _Tags()
    parser.feed(text)
    assert {tag for tag, _ in parser.tags} <= SAFE_TAGS, {tag for tag, _ in parser.tags}
    handlers = [name for _, attrs in parser.tags for name, _ in attrs if name.startswith("on")]
    assert not handlers, handlers


def assert_safe_terminal(text: str) -> None:
    assert not CONTROL_CHARACTER.search(text), CONTROL_CHARACTER.search(text)


def test_every_string_from_a_run_is_escaped_in_every_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    baseline = forged_run(tmp_path)
    candidate = variant(baseline, "candidate", "source = 'engine'")  # named by its engine id
    capsys.readouterr()
    out = tmp_path / "report"
    argv = ["report", "--baseline", str(baseline), "--candidate", str(candidate)]
    assert main([*argv, "--out-dir", str(out)]) in (0, 1)
    assert_safe_terminal(capsys.readouterr().out)

    markdown = (out / "report.md").read_text()
    assert_safe_markdown(markdown)
    assert r"\x1b[31m" in markdown and "sha256" in markdown, "the values are shown, escaped"

    html = (out / "report.html").read_text()
    assert_safe_html(html)
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    baseline_figures, baseline_series = read_run(baseline, None)
    candidate_figures, candidate_series = read_run(candidate, None)
    comparison = compare(baseline_figures, candidate_figures, load_thresholds(None), "defaults")
    for figure in comparison_figures(comparison, baseline_series, candidate_series):
        for trace in figure.data:  # Plotly draws <a href> and <b> in labels: none arrives
            values = () if trace.x is None else trace.x
            labels = [str(trace.name), *(str(value) for value in values)]
            assert not any("<" in label for label in labels), labels

    junit_text = (out / "junit.xml").read_text()
    assert not CONTROL_CHARACTER.search(junit_text) and "]]>" not in junit_text
    names = [case.get("name") or "" for case in ElementTree.parse(out / "junit.xml").iter()]
    assert any(r"\x1b[31m" in name for name in names), "tenant names shown, escaped"

    figures = json.loads((out / "figures.json").read_text())
    assert figures["baseline"]["config"]["hash_algo"].endswith(INJECTED)

    for run in (baseline, candidate):
        assert main(["summary", str(run)]) == 0
        summary = capsys.readouterr().out
        assert_safe_terminal(summary)
        # A line a figure, then the latency sentence after a blank line (one JSON key).
        figures, latency = summary.split("\n\n")
        assert latency.startswith("latency by hit share: ")
        assert len(figures.splitlines()) + 1 == len(json.loads(_summary_json(run, capsys)))

    # The advisor replays the run's cache: an unknown hash algorithm is refused, safely shown.
    assert main(["advise", str(baseline)]) == 2
    assert_safe_terminal(capsys.readouterr().err)
    for name, source in (("advised-replay", "replay"), ("advised-engine", "engine")):
        run = variant(baseline, name, f"hash_algo = 'sha256', source = '{source}'")
        assert main(["advise", str(run)]) == 0
        advice = capsys.readouterr().out
        assert_safe_markdown(advice)
        assert r"\x1b[31m" in advice and "## 3." in advice, "rules fired, names shown escaped"


def _summary_json(run: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["summary", str(run), "--json"]) == 0
    return capsys.readouterr().out


def test_the_overview_shows_a_runs_own_words_escaped(tmp_path: Path) -> None:
    """The Overview's caption and its capture-stopped warning are Markdown to Streamlit: the
    hash, the version, the file name and the engine's reason are shown, never drawn."""
    run = forged_run(tmp_path)
    with duckdb.connect(str(run)) as connection:
        connection.execute(
            "INSERT INTO meta VALUES (?, ?)", [f"capture_stopped {INJECTED} dp0", INJECTED]
        )
    app = start(run)
    shown = "\n".join(element.value for element in [*app.caption, *app.warning])
    assert "Capture stopped during this run" in shown
    assert r"\x1b\[31m" in shown, "the values are shown, escaped"
    assert_safe_markdown(shown)
