"""vLLM's own KV events: what a run got from an unmodified engine, what was lost on the way,
64-bit hash conflicts, the GPU pool and offload tiers apart when the run has tiers, and what
these events cannot tell."""

from __future__ import annotations

from datetime import datetime

import pandas as pd
import streamlit as st

from collector.charts.theme import on_wall_clock
from collector.model.run_calendar import DAY_S
from collector.queries import vllm_kv as vllm_kv_queries
from collector.store.run_file import RunFile
from collector.vllm_kv.wire import MEDIUM_GPU
from visualizer.charts import vllm_kv as vllm_kv_charts
from visualizer.downloads import show_chart
from visualizer.metrics import metric_row
from visualizer.sidebar import controls

HOW_TO_COLLECT = """
Start vLLM with its KV events on (ZMQ publisher, replay socket for lost batches), then point
kvscope's collector at it:

```sh
vllm serve MODEL --kv-events-config '{"enable_kv_cache_events": true,
    "publisher": "zmq", "endpoint": "tcp://*:5557",
    "replay_endpoint": "tcp://*:5558", "topic": "kv"}'
kvscope collect --db RUN.duckdb --vllm-kv-events tcp://ENGINE_HOST:5557 \\
    --vllm-kv-replay tcp://ENGINE_HOST:5558 --vllm-kv-topic kv
```

vLLM binds these sockets on every interface of the engine's host: keep the ports reachable
only from the collector.
"""

LIMITS = """
- **No allocations, frees, free-block counts or request ids.** The events say which block
  hashes entered the prefix cache (BlockStored), left it (BlockRemoved), or that all of it
  was reset (AllBlocksCleared), with the engine's clock per step. A freed block keeps its
  hash and emits nothing, so hit ratios, the free-block timeline and per-request or
  per-tenant views need kvscope's engine plugin or a replay.
- **A prefix hit emits nothing**, unless the request sets
  `SamplingParams(extra_args={"kv_cache_report_mode": "full"})`: then its lookup emits a
  BlockStored for the reused blocks (from the first block, no parent). "Blocks stored"
  counts such re-reports too; it is not a count of hits.
- **64-bit hashes.** By default vLLM publishes the low 64 bits of each block hash
  (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`). Two different blocks can share them: vLLM keeps
  them apart by the full hash, a consumer keying on the published one cannot. kvscope
  compares each BlockStored with what it last saw stored under that hash while cached
  (parent hash, token ids, extra keys) and reports a difference as a conflict.
- **Delivery is best effort.** PUB/SUB drops messages for late or slow subscribers; vLLM
  keeps its last `buffer_steps` (10,000) batches for a replay socket. kvscope asks it for
  every missing batch and records, as lost, what it could not get back.
- kvscope stores no token ids from these events (counts and digests), unless the collector
  was told to record them for hash conflicts.
"""

TIER_LIMITS = """
- **No tier hits.** vLLM's offloading connector (`--kv-offloading-size`) publishes which
  blocks its tier stored (BlockStored) and evicted (BlockRemoved), with `medium` "CPU", not
  which it loaded back. Tier hits (tokens loaded back from the tier) come from kvscope's
  engine plugin, whose lookup records carry the tokens vLLM's KV connector supplied, or from
  a replay with a tier (`kvscope replay --cpu-tier-blocks N`), not from KV events.
- **Blocks held are counted from announcements.** vLLM announces a hash again for every
  offloaded chunk that contains it (and the GPU pool for every block cached under it): a
  block counts as held while its stores outnumber its removals, and "blocks stored" counts
  each announcement. An AllBlocksCleared empties the GPU pool only; a reset that also resets
  the KV connector (`reset_prefix_cache(reset_connector=True)`) empties the tier without an
  event, so its count stays as it was.
- **Placeholders by default.** Unless the connector's extra config sets
  `"self_describing_kv_events": true` (`--kv-transfer-config '{"kv_connector_extra_config":
  {"self_describing_kv_events": true}}'`), vLLM announces each offloaded chunk by one hash
  (its last block's) and no tokens: the tier's counts are then chunks, and kvscope cannot
  check them for hash conflicts. Self-describing ones carry no extra keys, so each medium is
  checked apart from the others.
"""

RESENT_HELP = "batches that PUB/SUB lost and vLLM's replay socket sent again"


def render() -> None:
    run, _ = controls.render()  # vLLM's events are shown for the whole run
    summary = vllm_kv_queries.vllm_kv_summary(run)
    st.title("vLLM's KV events")
    has_tiers = False
    if summary["batches"] == 0 and summary["gaps"] == 0:
        st.info(
            "This run has no vLLM KV events: it was recorded by kvscope itself (a replay "
            "or the engine plugin), which sees more than these events carry."
        )
        st.markdown(HOW_TO_COLLECT)
    else:
        media = vllm_kv_queries.vllm_kv_media(run)
        has_tiers = bool((media["medium"] != MEDIUM_GPU).any())
        render_received(run, summary, media if has_tiers else None)
    st.subheader("What vLLM's KV events cannot tell")
    st.markdown(LIMITS + TIER_LIMITS if has_tiers else LIMITS)


def render_received(run: RunFile, summary: dict[str, int], media: pd.DataFrame | None) -> None:
    """Counts, the activity chart, the GPU pool and offload tiers apart (`media`, when the run
    has tiers), lost batches and hash conflicts of a run that has them."""
    metric_row(
        {
            "Batches received": f"{summary['batches']:,}",
            "Blocks stored": f"{summary['stored_blocks']:,}",
            "Blocks removed": f"{summary['removed_blocks']:,}",
            "Cache clears": f"{summary['clears']:,}",
        }
    )
    metric_row(
        {
            "Batches lost": f"{summary['lost_batches']:,}",
            "Resent by vLLM's replay": f"{summary['replayed_batches']:,}",
            "Hash conflicts": f"{summary['conflicts']:,}",
            "Published hashes": hash_width(summary),
        },
        {"Resent by vLLM's replay": RESENT_HELP},
    )
    st.caption(
        f"From {summary['dp_ranks']} data-parallel rank(s); engine restarts seen: "
        f"{summary['publisher_restarts']} (vLLM numbers its batches from 0 again after one)."
    )
    activity = vllm_kv_queries.vllm_kv_activity(run)
    origin = _origin(run)
    figure = on_wall_clock(vllm_kv_charts.vllm_kv_activity_figure(activity), origin)
    show_chart(figure, activity, key="vllm_kv_activity")
    if media is not None:
        render_tiers(run, media, origin)
    render_gaps(run, summary)
    render_conflicts(run, summary)


def render_tiers(run: RunFile, media: pd.DataFrame, origin: datetime | None) -> None:
    """Per medium (GPU pool, CPU tier): blocks stored, removed and held at the end; blocks held
    over time, and each tier's own stores and evictions; on the wall clock from `origin`
    (`_origin`), where the page's batches span more than a day."""
    names = [vllm_kv_charts.medium_name(medium) for medium in media["medium"]]
    occupancy = vllm_kv_queries.vllm_kv_tier_occupancy(run)
    held_at_end = occupancy.groupby("medium")["blocks_held"].last().to_dict()
    st.subheader(" and ".join(names))
    for name, row in zip(names, media.itertuples(), strict=True):
        metric_row(
            {
                f"{name}: blocks stored": f"{row.stored_blocks:,}",
                f"{name}: blocks removed": f"{row.removed_blocks:,}",
                f"{name}: blocks held at the end": f"{held_at_end[row.medium]:,}",
            }
        )
    st.caption(
        "A block (a DP rank's hash in one KV cache group) is held while vLLM announced it "
        "stored more often than removed; the GPU pool's count falls to 0 at each cache clear."
    )
    show_chart(
        on_wall_clock(vllm_kv_charts.vllm_kv_tier_occupancy_figure(occupancy), origin),
        occupancy,
        key="vllm_kv_tier_occupancy",
    )
    for medium, name in zip(media["medium"], names, strict=True):
        if medium == MEDIUM_GPU or len(media) == 1:
            continue  # the chart above shows a lone tier's events already
        activity = vllm_kv_queries.vllm_kv_activity(run, medium=medium)
        title = f"What the {name}'s events reported over time"
        show_chart(
            on_wall_clock(vllm_kv_charts.vllm_kv_activity_figure(activity, title), origin),
            activity,
            key=f"vllm_kv_activity_{medium.lower()}",
        )


def _origin(run: RunFile) -> datetime | None:
    """Where this page's charts start on the wall clock, the first batch's time, where its
    batches span more than a day (as `visualizer/wall_clock.py` reads a run: a collector that
    takes only vLLM's events has no records of its own); None where they read in seconds."""
    times = vllm_kv_queries.batch_times(run)
    if times is None or (times[1] - times[0]).total_seconds() <= DAY_S:
        return None
    return times[0]


def hash_width(summary: dict[str, int]) -> str:
    """Whether vLLM sent 64-bit ints (its default), full hash bytes, or both."""
    blocks = summary["stored_blocks"] + summary["removed_blocks"]
    if summary["full_hash_blocks"] == 0:
        return "64-bit"
    return "full" if summary["full_hash_blocks"] == blocks else "64-bit and full"


def render_gaps(run: RunFile, summary: dict[str, int]) -> None:
    st.subheader("Lost batches")
    if summary["gaps"] == 0:
        st.success(
            f"None: every batch arrived in order ({summary['replayed_batches']:,} of them "
            "resent through vLLM's replay socket after PUB/SUB lost them)."
        )
        return
    st.warning(
        f"{summary['lost_batches']:,} batches never arrived; what they stored or removed is "
        "missing from this run. A gap from batch 0 means the collector started after the "
        "engine, beyond what vLLM's replay buffer still held."
    )
    st.dataframe(vllm_kv_queries.vllm_kv_gaps(run), hide_index=True, key="vllm_kv_gaps")


def render_conflicts(run: RunFile, summary: dict[str, int]) -> None:
    st.subheader("Hash conflicts")
    num_hashes = summary["distinct_stored_hashes"]
    if summary["conflicts"] == 0:
        chance = num_hashes * (num_hashes - 1) / 2 / 2.0**64
        odds = (
            f" For that many random 64-bit hashes the chance of any shared one is {chance:.1e}."
            if hash_width(summary) != "full"
            else ""
        )
        st.success(
            f"0: no two different blocks arrived under one hash among "
            f"{summary['stored_blocks']:,} stored blocks ({num_hashes:,} distinct hashes).{odds}"
        )
        return
    st.error(
        f"Blocks that arrived under a hash a different cached block already had: "
        f"{summary['conflicts']:,}. vLLM keeps them apart by the full hash; a consumer "
        "keying on the published hash cannot tell them apart."
    )
    st.dataframe(vllm_kv_queries.vllm_kv_conflicts(run), hide_index=True, key="vllm_kv_conflicts")


if __name__ == "__main__":
    render()
