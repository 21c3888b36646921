"""Every chart with its downloads: the data behind it (CSV) and the figure (HTML)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from visualizer.run_source import current_run


def show_chart(
    figure: go.Figure, data: pd.DataFrame, key: str, *, container: Any = None, **chart_options: Any
) -> Any:
    """Draw a figure with two download buttons under it (in `container`, default the page);
    returns what st.plotly_chart does.

    The files are built only when a button is clicked, and clicking does not rerun the page.
    """
    target = st if container is None else container
    event = target.plotly_chart(figure, key=key, **chart_options)

    def csv() -> str:
        return data.to_csv(index=False)

    def html() -> str:
        return str(figure.to_html(include_plotlyjs=True, full_html=True))

    stem = f"{current_run().stem}-{key}"
    buttons = target.container(horizontal=True)
    for label, build, extension, mime in (
        ("Data (CSV)", csv, "csv", "text/csv"),
        ("Figure (HTML)", html, "html", "text/html"),
    ):
        buttons.download_button(
            label,
            data=build,
            file_name=f"{stem}.{extension}",
            mime=mime,
            key=f"{key}_{extension}",
            on_click="ignore",
        )
    return event
