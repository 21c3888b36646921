"""Overview: the run's hit rates, tokens saved, requests and evictions, and the same over time."""

from __future__ import annotations

import streamlit as st

from collector import queries
from collector.summary import run_summary
from visualizer import charts
from visualizer.run_source import connect, current_run


def render() -> None:
    path = current_run()
    connection = connect(path)
    summary = run_summary(connection)
    config = queries.run_config(connection)
    st.title("Overview")
    st.caption(
        f"{path.name}: {config['source']} of {config['trace'] or 'a live engine'}, "
        f"block size {config['block_size']}, {config['num_blocks']:,} blocks, "
        f"{config['hash_algo']}, vLLM {config['vllm_version']}"
    )
    first, second, third, fourth = st.columns(4)
    first.metric("Hit ratio (tokens)", f"{summary['token_hit_ratio']:.1%}")
    second.metric("Hit ratio (blocks)", f"{summary['block_hit_ratio']:.1%}")
    third.metric(
        "Tokens saved",
        f"{summary['hit_tokens']:,}",
        help="prompt tokens served from the prefix cache instead of recomputed",
    )
    fourth.metric("Requests", f"{summary['requests']:,}")
    first, second, third, fourth = st.columns(4)
    first.metric("Evictions", f"{summary['evictions']:,}")
    second.metric("Preemptions", f"{summary['preemptions']:,}")
    third.metric("Collisions", f"{summary['collisions']:,}")
    fourth.metric("Dropped events", f"{summary['dropped_events']:,}")
    buckets = queries.hit_rate_over_time(connection)
    st.plotly_chart(charts.hit_rate_figure(buckets), key="overview_hit_rate")
    st.plotly_chart(charts.activity_figure(buckets), key="overview_activity")
    with st.expander("Run configuration"):
        st.json({name: str(value) for name, value in config.items()})


if __name__ == "__main__":
    render()
