"""Headline figures as rows of `st.metric`, the way pages open."""

from __future__ import annotations

from collections.abc import Mapping

import streamlit as st

from visualizer.glossary import metric_help


def metric_row(
    values: Mapping[str, str],
    helps: Mapping[str, str] | None = None,
    falls: Mapping[str, str] | None = None,
) -> None:
    """One row of metrics, a column each in the mapping's order (label -> shown value), with
    the help text `helps` gives a label (else the glossary's: visualizer/glossary.py), and
    under a value the fall `falls` gives it (shown in green: a fall for the better)."""
    helps, falls = helps or {}, falls or {}
    for column, (label, value) in zip(st.columns(len(values)), values.items(), strict=True):
        fall = falls.get(label)
        column.metric(
            label,
            value,
            delta=fall,
            delta_color="inverse" if fall else "normal",
            help=helps.get(label) or metric_help(label),
        )
