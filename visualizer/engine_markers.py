"""Markers where the run's settings may have changed: each engine (engine id x DP rank) that
started after the run's first record and either took over from one that had stopped (an
engine restarted: another host:pid) or came with another pool than the engine that started
before it; an engine that joined a running fleet with the same pool changed nothing."""

from __future__ import annotations

import pandas as pd

from collector.model.run_calendar import RunCalendar
from collector.model.time_window import TimeWindow
from collector.queries.fleet import engine_labels


def engine_markers(starts: pd.DataFrame, window: TimeWindow) -> pd.DataFrame:
    """`t_s` and `label` of the engines of `fleet.engine_starts` marked (see above) that
    started inside the window."""
    starts = starts.assign(name=engine_labels(starts["engine_id"], starts["dp_rank"]))
    earlier = starts["pool_blocks"].shift()
    stopped_before = starts["end_s"].cummin().shift()  # the first stop among earlier engines
    rows = []
    for (_, start), before, stopped in zip(starts.iterrows(), earlier, stopped_before, strict=True):
        t_s, pool = float(start["t_s"]), start["pool_blocks"]
        if t_s <= 0 or not window.start_s <= t_s < window.end_s:
            continue
        other_pool = not pd.isna(pool) and not pd.isna(before) and int(before) != int(pool)
        if not other_pool and not stopped < t_s:
            continue
        label = f"{start['name']} started"
        if not pd.isna(pool):
            label += f", {int(pool):,} blocks"
        if other_pool:
            label += f" (was {int(before):,})"
        rows.append({"t_s": t_s, "label": label})
    return pd.DataFrame(rows, columns=["t_s", "label"])


def marker_words(markers: pd.DataFrame, calendar: RunCalendar) -> str:
    """The markers as one line, each at its wall time."""
    return "; ".join(
        f"{calendar.wall(t_s):%a %d %b %H:%M} UTC ({t_s:,.0f} s): {label}"
        for t_s, label in zip(markers["t_s"], markers["label"], strict=True)
    )
