"""The report as one self-contained HTML file: plotly.js is inlined, nothing is fetched."""

from __future__ import annotations

from dataclasses import replace

import plotly.graph_objects as go
import plotly.io

from collector.charts import comparison as charts
from collector.queries.tenants import TenantHitRatio
from collector.report.checks import FAIL
from collector.report.figures import RunFigures, RunSeries
from collector.report.formatting import format_change, format_limit, format_value
from collector.report.miss_breakdown import cause_rows
from collector.report.verdict import Comparison
from collector.safe_text import html_text

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 1rem 0; }
th, td { border-bottom: 1px solid #ddd; padding: .3rem .7rem; text-align: right; }
th:first-child, td:first-child, td.text { text-align: left; }
.verdict { font-size: 1.3rem; padding: .6rem 1rem; border-radius: .4rem; }
.verdict.pass { background: #e6f4ea; } .verdict.regression { background: #fce8e6; }
tr.fail td { background: #fce8e6; } tr.skip td { color: #888; }
.chart { margin: 1.5rem 0; }
"""
PLOT_CONFIG = {"displaylogo": False, "responsive": True}


def render_html(
    comparison: Comparison, baseline_series: RunSeries, candidate_series: RunSeries
) -> str:
    """Verdict, checks, notes, the charts, then every figure of both runs."""
    verdict = comparison.verdict
    regressed = ", ".join(check.name for check in comparison.regressed)
    headline = f"Regression: {regressed}" if regressed else "Pass: no check regressed"
    figures = comparison_figures(comparison, baseline_series, candidate_series)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>kvscope report: {verdict}</title><style>{STYLE}</style></head><body>",
        "<h1>kvscope prefix-cache report</h1>",
        f'<p class="verdict {verdict}">{html_text(headline, limit=None)}</p>',
        f"<p>Baseline <code>{html_text(comparison.baseline.path, limit=None)}</code>, "
        f"candidate <code>{html_text(comparison.candidate.path, limit=None)}</code>, "
        f"thresholds: {html_text(comparison.thresholds_source, limit=None)}.</p>",
        "<h2>Checks</h2>",
        _checks_table(comparison),
        *_notes(comparison.notes),
        *_miss_causes(comparison),
        "<h2>Charts</h2>",
        *(_chart(figure, index) for index, figure in enumerate(figures)),
        "<h2>Figures</h2>",
        _figures_table(comparison.baseline, comparison.candidate),
        "</body></html>",
    ]
    return "\n".join(parts)


def comparison_figures(
    comparison: Comparison, baseline_series: RunSeries, candidate_series: RunSeries
) -> list[go.Figure]:
    """The report's charts: hit ratio, free blocks, evictions over time; tenants (their
    names escaped: Plotly would draw a tag in a label)."""
    series = {"baseline": baseline_series, "candidate": candidate_series}
    return [
        charts.hit_ratio_comparison_figure({label: run.hit_rate for label, run in series.items()}),
        charts.free_blocks_comparison_figure(
            {label: (run.pool, run.usable_blocks) for label, run in series.items()}
        ),
        charts.evictions_comparison_figure({label: run.evictions for label, run in series.items()}),
        charts.tenant_hit_ratio_figure(
            {
                "baseline": _chart_rows(comparison.baseline.tenants),
                "candidate": _chart_rows(comparison.candidate.tenants),
            }
        ),
    ]


def _chart_rows(tenants: list[TenantHitRatio]) -> list[TenantHitRatio]:
    return [replace(row, tenant=html_text(row.tenant), lora=html_text(row.lora)) for row in tenants]


def _chart(figure: go.Figure, index: int) -> str:
    """One chart's <div>; the first one carries plotly.js itself, inline."""
    body = plotly.io.to_html(
        figure,
        full_html=False,
        include_plotlyjs=index == 0,
        config=PLOT_CONFIG,
        div_id=f"chart-{index}",
    )
    return f'<div class="chart">{body}</div>'


def _checks_table(comparison: Comparison) -> str:
    rows = [
        "<tr><th>check</th><th>baseline</th><th>candidate</th><th>change</th>"
        "<th>limit</th><th>result</th></tr>"
    ]
    for check in comparison.checks:
        result = check.status if check.status != "skip" else f"skipped: {check.reason}"
        cells = [
            f'<td class="text">{html_text(check.title, limit=None)}<br>'
            f"<code>{html_text(check.name, limit=None)}</code></td>",
            f"<td>{format_value(check.baseline, check.unit)}</td>",
            f"<td>{format_value(check.candidate, check.unit)}</td>",
            f"<td>{format_change(check)}</td>",
            f"<td>{html_text(format_limit(check))}</td>",
            f'<td class="text">'
            f"{'<b>FAIL</b>' if check.status == FAIL else html_text(result, limit=None)}</td>",
        ]
        rows.append(f'<tr class="{check.status}">{"".join(cells)}</tr>')
    return f"<table>{''.join(rows)}</table>"


def _notes(notes: list[str]) -> list[str]:
    if not notes:
        return []
    items = "".join(f"<li>{html_text(note, limit=None)}</li>" for note in notes)
    return ["<h2>Notes</h2>", f"<ul>{items}</ul>"]


def _miss_causes(comparison: Comparison) -> list[str]:
    """Why the prompt tokens missed, in both runs (information, not a check)."""
    parts = [
        "<h2>Why prompt tokens missed</h2>",
        f"<p>{html_text(comparison.miss_line, limit=None)}</p>",
    ]
    rows = cause_rows(comparison.baseline.misses, comparison.candidate.misses)
    if rows:
        cells = "".join(
            f'<tr><td class="text">{html_text(name)}</td><td>{old}</td><td>{new}</td>'
            f"<td>{change}</td></tr>"
            for name, old, new, change in rows
        )
        parts.append(
            "<table><tr><th>cause</th><th>baseline</th><th>candidate</th><th>change</th></tr>"
            f"{cells}</table>"
        )
    return parts


def _figures_table(baseline: RunFigures, candidate: RunFigures) -> str:
    """Every scalar figure of both runs (tenants are in the chart and figures.json)."""
    old, new = _flat(baseline), _flat(candidate)
    rows = ["<tr><th>figure</th><th>baseline</th><th>candidate</th></tr>"]
    for name, value in old.items():
        rows.append(
            f'<tr><td class="text">{html_text(name)}</td>'
            f"<td>{html_text(value)}</td><td>{html_text(new[name])}</td></tr>"
        )
    return f"<table>{''.join(rows)}</table>"


def _flat(run: RunFigures) -> dict[str, str]:
    figures = run.to_dict()
    flat: dict[str, str] = {}
    for section in ("summary", "eviction_regret", "free_blocks"):
        for name, value in figures[section].items():
            shown = f"{value:.4f}" if isinstance(value, float) else f"{value}"
            flat[f"{section}.{name}" if section != "summary" else name] = shown
    flat["evictions_per_request"] = f"{run.evictions_per_request:.4f}"
    for name in ("source", "trace", "timing", "max_num_seqs", "vllm_version", "run_id"):
        flat[f"run.{name}"] = str(run.config.get(name))
    return flat
