"""Colours for categories (tenants, adapters, verdicts), the same label always the same."""

from __future__ import annotations

from collections.abc import Iterable

CATEGORY_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#d62728",
    "#7f7f7f",
)
NO_LABEL_COLOR = "#c7c7c7"
VERDICT_COLORS = {"better": "#2ca02c", "worse": "#d62728", "same": "#7f7f7f", "": "#1f77b4"}


def category_colors(labels: Iterable[str]) -> dict[str, str]:
    """A colour per distinct label, in sorted order; "(none)" and "" are grey."""
    distinct = sorted({label for label in labels if label not in ("(none)", "")})
    colors = {
        label: CATEGORY_COLORS[index % len(CATEGORY_COLORS)] for index, label in enumerate(distinct)
    }
    return colors | {"(none)": NO_LABEL_COLOR, "": NO_LABEL_COLOR}
