"""Advisor: ranked suggestions with their evidence, predicted effect, exact setting and charts,
and the what-if curves (hit ratio against KV cache memory, per block size)."""

from __future__ import annotations

from dataclasses import asdict, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import streamlit as st

from collector.advisor import RunContext, advise
from collector.advisor.context import PCIE_GB_PER_S
from collector.advisor.curves import whatif_curves
from collector.advisor.formats import to_document
from collector.advisor.scheduler_ratios import SchedulerCheck
from collector.advisor.stored import keep, lookup, result_record
from collector.advisor.suggestion import TIME_TITLE
from collector.charts.theme import on_wall_clock
from collector.model.kv_memory import DEFAULT_GPU_GIB, MODELS, GpuMemory, KVSpec
from collector.queries import kv_groups
from collector.replay.whatif import read_results
from visualizer import health_card
from visualizer.charts.advisor import chart_data, chart_figure
from visualizer.downloads import show_chart
from visualizer.kv_spec_inputs import model_and_dtype
from visualizer.metrics import metric_row
from visualizer.run_source import current_run, open_run
from visualizer.sidebar import controls
from visualizer.wall_clock import chart_origin


@st.cache_resource(max_entries=8)
def _replay_cache(path: str, modified_ns: int) -> dict[tuple[int, ...], SchedulerCheck]:
    """One run file's replays through vLLM's Scheduler, by pool sizes: they depend on the run
    alone, so a change of assumptions does not replay them again."""
    del path, modified_ns  # the cache key
    return {}


@st.cache_data(
    max_entries=8,
    show_spinner="Running the advisor's rules (the first view of a run whose requests "
    "overlapped replays them through vLLM's Scheduler: up to about half a minute; "
    "`kvscope advise RUN` works it out ahead and keeps it in the run file) ...",
)
def _advice(
    path: str,
    modified_ns: int,
    spec: KVSpec,
    gpu: tuple[float, float] | None,
    whatif: str,
    *,
    max_model_len: int | None,
    pcie_gb_per_s: float,
    _scheduler_checks: dict[tuple[int, ...], SchedulerCheck],
) -> dict[str, Any]:
    """The advice document and the what-if curves for one run and one set of assumptions
    (`_scheduler_checks`, the run's Scheduler replays, is left out of the cache key)."""
    del modified_ns  # part of the cache key: a rewritten run is advised afresh
    context = RunContext(
        open_run(Path(path)),
        Path(path),
        spec,
        GpuMemory(*gpu) if gpu else None,
        read_results(Path(whatif)).results if whatif else [],
        max_model_len=max_model_len,
        pcie_gb_per_s=pcie_gb_per_s,
        scheduler_checks=_scheduler_checks,
    )
    kept = lookup(context)  # `kvscope advise` kept it in the run file, or an earlier view
    if kept is not None:
        return {"document": kept["document"], "curves": kept["curves"]}
    document = to_document(advise(context), context)
    curves = asdict(whatif_curves(context))
    record = result_record(context, document, curves)
    if record is not None:  # never into the run file this app holds open: the cache folder
        keep(record, Path(path), lambda: context.replay_cache, in_run=False)
        health_card.forget_scorecards()  # the Overview's advisor line can show it now
    return {"document": document, "curves": curves}


def _assumptions() -> tuple[KVSpec, tuple[float, float] | None, str, int | None, float]:
    """The KV spec, GPU, what-if folder, --max-model-len and PCIe bandwidth the figures
    assume; the user can change each."""
    with st.expander("Assumptions: model KV spec, GPU, what-if sweep, PCIe", expanded=False):
        first, second, third = st.columns(3)
        model, dtype = model_and_dtype(first, second, "advisor")
        parallel = third.number_input("Tensor parallel size", 1, 64, 1, key="advisor_tp")
        gpu_gib = first.number_input(
            "GPU memory, GiB (0: unknown)",
            0.0,
            1024.0,
            DEFAULT_GPU_GIB,
            key="advisor_gpu_gib",
            help="80: about an H100's",
        )
        utilization = second.number_input(
            "Current --gpu-memory-utilization", 0.05, 1.0, 0.9, key="advisor_gpu_util"
        )
        whatif = third.text_input(
            "What-if sweep folder (kvscope whatif --out)", "", key="advisor_whatif"
        )
        max_model_len = first.number_input(
            "Engine --max-model-len (0: unknown)",
            0,
            10_000_000,
            0,
            key="advisor_max_model_len",
            help="A suggested pool too small for one request this long is flagged: vLLM "
            "refuses to start with it",
        )
        pcie = second.number_input(
            "PCIe bandwidth, GB/s",
            0.1,
            1000.0,
            PCIE_GB_PER_S,
            key="advisor_pcie",
            help="What a CPU tier's loads move at, host to GPU (25: PCIe 4.0 x16 in practice)",
        )
    spec = replace(MODELS[model], dtype=dtype, tensor_parallel_size=int(parallel))
    gpu = (float(gpu_gib), float(utilization)) if gpu_gib > 0 else None
    return spec, gpu, whatif.strip(), int(max_model_len) or None, float(pcie)


def render() -> None:
    run, _ = controls.render()
    path = current_run()
    st.title("Advisor")
    spec, gpu, whatif, max_model_len, pcie_gb_per_s = _assumptions()
    if whatif and not (Path(whatif) / "whatif.json").is_file():
        st.error(f"{whatif}: no whatif.json there; run `kvscope whatif ... --out {whatif}` first")
        whatif = ""
    modified_ns = path.stat().st_mtime_ns
    result = _advice(
        str(path),
        modified_ns,
        spec,
        gpu,
        whatif,
        max_model_len=max_model_len,
        pcie_gb_per_s=pcie_gb_per_s,
        _scheduler_checks=_replay_cache(str(path), modified_ns),
    )
    document = result["document"]
    suggestions = document["suggestions"]
    config = document["run_config"]
    st.caption(
        f"{path.name}: block size {config['block_size']}, {_pools(config)}; token hit ratio "
        f"{document['token_hit_ratio']:.1%}. Predictions come from one-pass LRU curves (one "
        "request at a time); a run whose requests overlapped has its cache size's hit ratios "
        "replayed through vLLM's Scheduler at its arrival times, and a what-if sweep, when "
        "given, decides the size; each suggestion names its source. Memory assumes "
        f"{spec.name} with a {spec.dtype} KV cache. The advice covers the whole run "
        "(the time filter does not apply here)."
    )
    _fleet_and_groups_notes(config, len(kv_groups.layout(run)))
    gain = max((entry["gain_tokens"] for entry in suggestions), default=0.0)
    metric_row(
        {
            "Suggestions": str(len(suggestions)),
            "High severity": str(sum(entry["severity"] == "high" for entry in suggestions)),
            "Largest predicted gain": f"{gain:,.0f} tokens",
        }
    )
    curves = result["curves"]
    show_chart(chart_figure(curves), chart_data(curves), key="advisor_whatif_curves")
    origin = chart_origin(run)
    for entry in suggestions:
        _suggestion(entry, origin)
    st.subheader("Checks")
    # Plain text in the table: a title's `code` marks show as literal backticks there.
    checks = [{**check, "detail": check["detail"].replace("`", "")} for check in document["checks"]]
    st.dataframe(checks, hide_index=True, key="advisor_checks")


def _fleet_and_groups_notes(config: dict[str, Any], num_groups: int) -> None:
    """What the advice cannot say as precisely of a fleet's run, or of a hybrid model's."""
    if config["num_engines"] > 1:
        st.info(
            f"This run has {config['num_engines']} engines, each with its own pool of "
            f"{config['num_blocks']:,} blocks. The curves are each engine's own (its requests "
            "in its order), summed over the fleet: every pool size and memory figure is per "
            "engine. Rules that model one pool are skipped; the Checks table says why."
        )
    if num_groups > 1:
        st.warning(
            f"This run has {num_groups} KV cache groups (a hybrid model), all in one pool. "
            "The one-pass curves model one full-attention group, so their pool sizes and "
            "memory are only a guide here: replay the what-ifs through vLLM's hybrid manager "
            "with `kvscope whatif TRACE --kv-layout LAYOUT --num-blocks ... --out DIR` (from "
            "a run with token ids, the run's own layout is the default) and give DIR above."
        )


def _pools(config: dict[str, Any]) -> str:
    if config["num_engines"] == 1:
        return f"{config['num_blocks']:,} blocks"
    return f"{config['num_engines']} engines of {config['num_blocks']:,} blocks each"


def _suggestion(entry: dict[str, Any], origin: datetime | None) -> None:
    """A suggestion and its charts, those over the run's time (`warming`'s uses) on the wall
    clock from `origin` (`visualizer/wall_clock.py`)."""
    st.subheader(f"{entry['rank']}. {entry['title']}")
    st.caption(f"{entry['severity']} · rule `{entry['rule']}`")
    st.markdown("**Evidence**\n" + "".join(f"\n- {line}" for line in entry["evidence"]))
    st.markdown(f"**Predicted effect**: {entry['effect']}")
    st.markdown(f"**Do this**: {entry['action']}")
    columns = st.columns(max(len(entry["charts"]), 1))
    for number, chart in enumerate(entry["charts"]):
        figure = chart_figure(chart)
        show_chart(
            on_wall_clock(figure, origin if chart["x_title"] == TIME_TITLE else None),
            chart_data(chart),
            key=f"advisor_{entry['rank']}_chart_{number}",
            container=columns[number],
        )


if __name__ == "__main__":
    render()
