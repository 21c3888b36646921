"""The report as JUnit XML: one test case per check, so CI systems list them as tests."""

from __future__ import annotations

from xml.etree import ElementTree

from collector.report.checks import FAIL, SKIP
from collector.report.formatting import describe
from collector.report.verdict import Comparison
from collector.safe_text import shown

SUITE = "kvscope.prefix_cache"


def render_junit(comparison: Comparison) -> str:
    """A <testsuites> document with one <testsuite> and a <testcase> per check."""
    checks = comparison.checks
    counts = {
        "tests": str(len(checks)),
        "failures": str(sum(check.status == FAIL for check in checks)),
        "errors": "0",
        "skipped": str(sum(check.status == SKIP for check in checks)),
        "time": "0",
    }
    root = ElementTree.Element("testsuites", {"name": "kvscope report", **counts})
    suite = ElementTree.SubElement(root, "testsuite", {"name": SUITE, **counts})
    properties = ElementTree.SubElement(suite, "properties")
    for name, value in (
        ("baseline", str(comparison.baseline.path)),
        ("candidate", str(comparison.candidate.path)),
        ("thresholds", comparison.thresholds_source),
        ("verdict", comparison.verdict),
    ):
        ElementTree.SubElement(properties, "property", {"name": name, "value": shown(value)})
    for check in checks:
        case = ElementTree.SubElement(
            suite,
            "testcase",
            {"classname": SUITE, "name": shown(check.name, limit=None), "time": "0"},
        )
        sentence = shown(describe(check))
        if check.status == FAIL:
            failure = ElementTree.SubElement(
                case, "failure", {"type": "regression", "message": sentence}
            )
            failure.text = sentence
        elif check.status == SKIP:
            ElementTree.SubElement(case, "skipped", {"message": shown(check.reason)})
        else:
            ElementTree.SubElement(case, "system-out").text = sentence
    ElementTree.indent(root)
    body = ElementTree.tostring(root, encoding="unicode")
    return f'<?xml version="1.0" encoding="UTF-8"?>\n{body}\n'
