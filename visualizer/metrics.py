"""Headline figures as rows of `st.metric`, the way pages open."""

from __future__ import annotations

from collections.abc import Mapping

import streamlit as st


def metric_row(values: Mapping[str, str], helps: Mapping[str, str] | None = None) -> None:
    """One row of metrics, a column each in the mapping's order (label -> shown value), with
    the help text `helps` gives a label."""
    helps = helps or {}
    for column, (label, value) in zip(st.columns(len(values)), values.items(), strict=True):
        column.metric(label, value, help=helps.get(label))
