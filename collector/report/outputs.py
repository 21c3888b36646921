"""Writes the report's files: all rendered first, then each written under a temporary name
and renamed, so a failure never leaves a half-written report."""

from __future__ import annotations

import json
import os
from pathlib import Path

from collector.report.figures import RunSeries
from collector.report.html import render_html
from collector.report.junit import render_junit
from collector.report.markdown import render_markdown
from collector.report.verdict import Comparison

FILE_NAMES = ("report.md", "report.html", "junit.xml", "figures.json")


def write_report(
    out_dir: Path,
    comparison: Comparison,
    baseline_series: RunSeries,
    candidate_series: RunSeries,
) -> list[Path]:
    """Write report.md, report.html, junit.xml and figures.json into `out_dir`."""
    texts = (
        render_markdown(comparison),
        render_html(comparison, baseline_series, candidate_series),
        render_junit(comparison),
        json.dumps(comparison.to_dict(), indent=2, sort_keys=True) + "\n",
    )
    paths = [out_dir / name for name in FILE_NAMES]
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for path, text in zip(paths, texts, strict=True):
            _write_atomically(path, text)
    except OSError as error:
        raise ValueError(f"{out_dir}: cannot write the report: {error.strerror}") from error
    return paths


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
