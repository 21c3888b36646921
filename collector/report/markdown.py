"""The report as Markdown, sized for a pull-request comment."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from collector.report.checks import FAIL, PASS, Check
from collector.report.figures import RunFigures
from collector.report.formatting import format_change, format_limit, format_value
from collector.report.miss_breakdown import cause_rows
from collector.report.verdict import Comparison
from collector.safe_text import code, markdown_text

# A workflow finds its earlier comment by this line and edits it instead of adding another.
MARKER = "<!-- kvscope-report -->"
ICONS = {PASS: "✅", FAIL: "❌"}
SKIPPED_ICON = "⏭️"


def render_markdown(comparison: Comparison) -> str:
    """Verdict, the checks table, notes, and the two runs side by side (folded)."""
    lines = [MARKER, _heading(comparison), ""]
    if comparison.regressed:
        names = ", ".join(code(check.name) for check in comparison.regressed)
        lines += [f"Regressed: {names}", ""]
    lines += [
        "| | check | baseline | candidate | change | limit |",
        "| :-: | --- | --: | --: | --: | --- |",
        *(_check_row(check) for check in comparison.checks),
        "",
    ]
    if comparison.notes:
        lines += [
            "Notes:",
            *(f"- {markdown_text(note, limit=None)}" for note in comparison.notes),
            "",
        ]
    lines += _miss_causes(comparison)
    lines += _runs_table(comparison.baseline, comparison.candidate)
    source = comparison.thresholds_source
    thresholds = "kvscope's defaults" if source == "defaults" else code(source)
    lines += [
        f"Thresholds: {thresholds}. `kvscope report` wrote the HTML report (charts), "
        "junit.xml and figures.json beside this Markdown.",
        "",
    ]
    return "\n".join(lines)


def _heading(comparison: Comparison) -> str:
    total = sum(1 for check in comparison.checks if check.status != "skip")
    if comparison.regressed:
        count = len(comparison.regressed)
        return f"### ❌ kvscope: prefix caching regressed ({count} of {total} checks failed)"
    return f"### ✅ kvscope: prefix caching holds ({total} checks passed)"


def _check_row(check: Check) -> str:
    icon = ICONS.get(check.status, SKIPPED_ICON)
    limit = f"skipped: {check.reason}" if check.status == "skip" else format_limit(check)
    cells = [
        icon,
        f"{markdown_text(check.title, limit=None)} ({code(check.name)})",
        format_value(check.baseline, check.unit),
        format_value(check.candidate, check.unit),
        format_change(check),
        markdown_text(limit, limit=None),
    ]
    return "| " + " | ".join(cells) + " |"


def _miss_causes(comparison: Comparison) -> list[str]:
    """Why the prompt tokens missed, in both runs: the cause that grew most (information,
    not a check), then each cause's share and tokens."""
    line = comparison.miss_line
    lines = ["#### Why prompt tokens missed", "", f"{line[0].upper()}{line[1:]}.", ""]
    rows = cause_rows(comparison.baseline.misses, comparison.candidate.misses)
    if not rows:
        return lines
    lines += ["| cause | baseline | candidate | change |", "| --- | --: | --: | --: |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]


_RUN_COUNTS = ("requests", "prompt_tokens", "hit_tokens", "evictions", "preemptions")
_RUN_LABELS = (
    "run file",
    "source",
    "block size, blocks, hash",
    "requests",
    "prompt tokens",
    "hit tokens",
    "evictions",
    "preemptions",
    "fewest free blocks",
    "vLLM",
)


def _runs_table(baseline: RunFigures, candidate: RunFigures) -> list[str]:
    lines = [
        "<details><summary>The two runs</summary>",
        "",
        "| | baseline | candidate |",
        "| --- | --: | --: |",
    ]
    columns = zip(_RUN_LABELS, _run_cells(baseline), _run_cells(candidate), strict=True)
    lines += [f"| {label} | {old} | {new} |" for label, old, new in columns]
    return [*lines, "", "</details>", ""]


def _run_cells(run: RunFigures) -> list[str]:
    summary, free_blocks, config = run.summary, run.free_blocks, run.config
    counts: Mapping[str, Any] = run.summary  # read by name below
    if config.get("source") == "replay" and config.get("trace"):
        trace = Path(str(config["trace"])).name
        source = f"replay of {code(trace)} ({markdown_text(config.get('timing'))})"
    else:
        source = markdown_text(config.get("source"))
    return [
        code(run.path.name),
        source,
        f"{summary['block_size']}, {summary['num_blocks']:,}, {code(summary['hash_algo'])}",
        *(format_value(counts[name], "count") for name in _RUN_COUNTS),
        f"{free_blocks['min_free_blocks']:,} of {free_blocks['usable_blocks']:,}",
        code(config.get("vllm_version")),
    ]
