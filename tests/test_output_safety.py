"""Tenant and adapter names are untrusted text: a run whose names hold Markdown links and
images, HTML, pipes, backticks, control characters and terminal escapes still gives valid
JUnit XML, an intact report.md, a clean terminal and an Advisor page that shows them as text."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from xml.etree import ElementTree

import duckdb
import pytest

from collector.cli import main
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
