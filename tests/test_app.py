"""The app in Streamlit's AppTest: every page on the sample run, with non-empty charts and
their downloads; the run picker, the time filter, a prefix-tree selection and the ROI inputs
driven like a user would; every page on a window with nothing in it."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from collector.queries import activity, hotspots, prefix_tree, roi
from collector.queries.summary import run_summary
from collector.queries.timeline import time_grid
from collector.replay.sample_text import INTROS
from collector.store.run_file import RunFile
from collector.token_text import SAMPLE_TOKENIZER
from tests.support.app import go_to, metrics, start
from tests.support.block_manager import tiny_run
from tests.support.repo import SAMPLE_RUN
from tests.support.runs import SHARED_PREFIX, shared_prefix_run
from visualizer.pages import PAGES as APP_PAGES

# Every page but vLLM's KV events, whose charts need a run that has them
# (tests/test_vllm_kv_page.py).
PAGES = [page.path for page in APP_PAGES if page.file != "vllm_kv_events.py"]
SECOND_SAMPLE_RUN = SAMPLE_RUN.with_name("run_block32.duckdb")
DATA_FIELDS = ("x", "y", "z", "values", "ids")
# Per page, on the sample run: how many traces each of its charts draws, in page order.
CHART_TRACES = {
    # why prompts missed: the waterfall, the families' losses by cause; TTFT by hit share
    # (p50, p90, p99); then the figures over time (integrity: a badge, the sample has
    # nothing wrong)
    "views/overview.py": [1, 6, 3, 2, 2, 2, 3],
    "views/requests.py": [2],  # the first request's prompt: cold blocks, its partial tail
    "views/hotspots.py": [1, 1, 1, 2],
    "views/prefix_tree.py": [4],
    "views/roi.py": [2, 1, 1],
    "views/free_blocks.py": [5, 1],
    "views/collisions.py": [2],
    "views/tenants.py": [2, 2, 1],
    # cache-size: the curve and the Scheduler replays' points; cpu-tier: LRU and ARC by tier size
    "views/advisor.py": [5, 2, 1, 1, 2, 1, 1],
    "views/policies.py": [4],
    "views/compare.py": [1, 2],
    "views/kv_groups.py": [],  # one group: its blocks are the free-block timeline's
    "views/fleet.py": [],  # one engine: tests/test_fleet_page.py shows two
}


def chart_traces(app: AppTest) -> list[list[dict[str, Any]]]:
    return [json.loads(chart.proto.spec)["data"] for chart in app.get("plotly_chart")]


def chart_titles(app: AppTest) -> list[str]:
    return [
        json.loads(chart.proto.spec)["layout"]["title"]["text"] for chart in app.get("plotly_chart")
    ]


def values(trace: dict[str, Any], field: str) -> list[Any]:
    """A trace's data, decoded when Plotly sent it as a typed array (dtype + base64)."""
    data = trace.get(field)
    if isinstance(data, dict):
        return np.frombuffer(base64.b64decode(data["bdata"]), dtype=data["dtype"]).tolist()
    return list(data or [])


def captions(app: AppTest) -> str:
    return "\n".join(caption.value for caption in app.caption)


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_non_empty_charts_with_downloads(page: str) -> None:
    app = go_to(start(), page)
    traces = chart_traces(app)
    assert [len(data) for data in traces] == CHART_TRACES[page]
    for data in traces:
        assert any(values(trace, field) for trace in data for field in DATA_FIELDS), data
    downloads = [button.proto.label for button in app.get("download_button")]
    assert downloads == ["Data (CSV)", "Figure (HTML)"] * len(traces)


def test_overview_figures_match_the_summary() -> None:
    app = start()
    with RunFile.open(SAMPLE_RUN) as run_file:
        summary = run_summary(run_file)
    shown = metrics(app)
    assert shown["Requests"] == f"{summary['requests']:,}" == "500"
    assert shown["Hit ratio (tokens)"] == f"{summary['token_hit_ratio']:.1%}"
    assert shown["Hit ratio (blocks)"] == f"{summary['block_hit_ratio']:.1%}"
    assert shown["Tokens saved"] == f"{summary['hit_tokens']:,}"
    assert shown["Evictions"] == f"{summary['evictions']:,}"
    assert shown["Collisions"] == "0"
    assert shown["Dropped events"] == "0"
    # Pool pressure up front: the sample's pool runs empty, with 5 preemptions.
    usable = summary["num_blocks"] - 1
    assert summary["min_free_blocks"] == 0
    assert shown["Fewest free blocks"] == f"0 of {usable:,} (0.0%)"
    assert shown["Time under 10 % free"] == (
        f"{summary['low_free_s']:,.1f} s ({summary['low_free_time_share']:.0%})"
    )
    assert summary["low_free_s"] > 0
    assert shown["Preemptions"] == f"{summary['preemptions']:,}" == "1"
    # Nothing went wrong: a badge, not a flat chart.
    assert [badge.value for badge in app.success] == [
        f"Integrity: 0 collisions in {summary['block_hits']:,} block hits checked; "
        "0 dropped events."
    ]
    # The trace by its name (its folder is the replaying machine's); the settings by their
    # human names, the raw keys (each option a row) behind a toggle.
    assert "run.duckdb: replay of trace.jsonl.gz, block size 16" in captions(app)
    (config,) = [frame.value for frame in app.dataframe if "setting" in frame.value]
    settings = dict(config.to_numpy().tolist())
    assert settings["block size"] == "16 tokens"
    assert settings["KV cache pool"] == "1,200 blocks (19,200 tokens of KV cache)"
    assert settings["KV cache groups"] == "full attention"
    assert settings["collision check"] == "yes"
    assert len(settings) <= 20 and not any("options" in name for name in settings)
    app.toggle(key="overview_config_raw_keys").set_value(True).run()
    (raw,) = [frame.value for frame in app.dataframe if "key" in frame.value]
    keys = dict(raw.to_numpy().tolist())
    assert keys["options.kv_layout"] == "full"
    assert keys["options.check_collisions"] == "True"
    assert keys["options.step_model.step_ms"] == "10.0"
    assert keys["options.kv_groups[0].kind"] == "full"
    assert keys["options.kv_groups[0].block_size"] == "16"
    assert "options" not in keys and "options.kv_groups" not in keys


def test_run_picker_switches_to_another_run_in_the_folder() -> None:
    app = start()
    picker = app.selectbox(key="run_picker")
    assert picker.options == [
        "run.duckdb",
        "run_block32.duckdb",
        "run_hybrid.duckdb",
        "run_tier.duckdb",
    ]
    picker.select(str(SECOND_SAMPLE_RUN)).run()
    assert not app.exception, app.exception
    assert app.session_state["run_path"] == str(SECOND_SAMPLE_RUN)
    assert "block size 32" in captions(app)
    with RunFile.open(SECOND_SAMPLE_RUN) as run_file:
        summary = run_summary(run_file)
    assert metrics(app)["Hit ratio (tokens)"] == f"{summary['token_hit_ratio']:.1%}"
    # The page itself follows the run on the next page too.
    assert "block size 32" in captions(go_to(app, "views/overview.py"))


def test_run_picker_reads_any_folder_and_refuses_a_foreign_file(tmp_path: Path) -> None:
    run = shared_prefix_run(tmp_path / "runs")
    (tmp_path / "runs" / "notes.duckdb").write_bytes(b"not a database")
    app = start()
    app.text_input(key="run_folder").input(str(tmp_path / "runs")).run()
    picker = app.selectbox(key="run_picker")
    # The run shown stays first (with its folder: it is not in this one) until another is
    # picked; a file that is no run says so.
    assert picker.options == [
        str(SAMPLE_RUN),
        "notes.duckdb (not a run: not a DuckDB file, so not a kvscope run)",
        "run.duckdb",
    ]
    picker.select(str(run)).run()
    assert not app.exception, app.exception
    assert metrics(app)["Requests"] == "4"
    app.selectbox(key="run_picker").select(str(tmp_path / "runs" / "notes.duckdb")).run()
    assert not app.exception, app.exception
    assert "notes.duckdb" in app.error[0].value


def test_a_folder_opens_its_first_run(tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    shared_prefix_run(folder)
    duckdb.connect(str(folder / "another.duckdb")).close()  # DuckDB's, not kvscope's
    app = start(folder)
    assert app.session_state["run_path"] == str(folder / "another.duckdb")
    assert "another.duckdb: not a kvscope run (no meta table)" in app.error[0].value
    assert app.selectbox(key="run_picker").options == [
        "another.duckdb (not a run: not a kvscope run (no meta table))",
        "run.duckdb",
    ]
    app.selectbox(key="run_picker").select(str(folder / "run.duckdb")).run()
    assert metrics(app)["Requests"] == "4"
    (tmp_path / "nothing").mkdir()
    empty = start(tmp_path / "nothing")
    assert "a folder, not a run file (its .duckdb files: none)" in empty.error[0].value


def test_hotspots_rank_blocks_by_hits_stores_or_evictions() -> None:
    app = go_to(start(), "views/hotspots.py")
    assert app.subheader[0].value == "Most-hit blocks"
    app.radio(key="hotspots_top_measure").set_value("evictions").run()
    assert not app.exception, app.exception
    with RunFile.open(SAMPLE_RUN) as run_file:
        window = time_grid(run_file).whole_run()
        top = hotspots.top_blocks(run_file, window, 400, measure="evictions")
    expected = hotspots.block_runs(top, "evictions", 20)
    assert app.subheader[0].value == "Most-evicted blocks"
    (table,) = [frame.value for frame in app.dataframe if "first block hash" in frame.value]
    assert table["first block hash"].tolist() == expected["first_hash"].tolist()
    assert table["blocks"].tolist() == expected["blocks"].tolist()
    assert table["evictions"].is_monotonic_decreasing and table["evictions"].iloc[0] > 1
    assert "Most-evicted cached blocks" in chart_titles(app)


def test_time_filter_narrows_every_page() -> None:
    app = start()
    app.slider(key="time_range").set_range(50.0, 100.0).run()
    assert not app.exception, app.exception
    with RunFile.open(SAMPLE_RUN) as run_file:
        window = time_grid(run_file).window(50.0, 100.0)
        figures = activity.window_figures(run_file, window)
    shown = metrics(app)
    assert shown["Requests"] == f"{figures['requests']:,}"
    assert shown["Hit ratio (tokens)"] == f"{figures['token_hit_ratio']:.1%}"
    assert 0 < figures["requests"] < 500
    # The same range on another page, and on its chart's axis.
    app = go_to(app, "views/collisions.py")
    assert "50.0-100.0 s of 215.5 s" in captions(app)
    assert f"{figures['block_hits']:,} block hits checked" in app.success[0].value
    times = values(chart_traces(app)[0][0], "x")
    assert min(times) >= 50.0 and max(times) < 100.0


def test_prefix_tree_selection_shows_that_block() -> None:
    app = go_to(start(), "views/prefix_tree.py")
    picker = app.selectbox(key="prefix_tree_node")
    chosen = picker.options[3]
    block = chosen.rsplit(" · ", 1)[1]  # labels end with the hash's first 8 hex digits
    picker.select_index(3).run()
    assert not app.exception, app.exception
    block_id = next(
        header.value.split()[1] for header in app.subheader if header.value.startswith("Block")
    )
    assert block_id.startswith(block)
    with RunFile.open(SAMPLE_RUN) as run_file:
        summary = prefix_tree.node_details(
            run_file, int(block_id, 16), time_grid(run_file).whole_run()
        ).summary
        hits, evictions = run_file.rows(
            "SELECT count(*) FILTER (WHERE kind = 'hit'), count(*) FILTER (WHERE kind = 'evict') "
            "FROM events WHERE block_hash = $hash",
            {"hash": int(block_id, 16)},
        )[0]
    shown = metrics(app)
    assert shown["Hits"] == f"{hits:,}" == f"{summary.hits:,}"
    assert shown["Times evicted"] == f"{evictions:,}" == f"{summary.evictions:,}"
    assert shown["Times re-stored"] == f"{summary.restores:,}"
    history = next(table.value for table in app.dataframe if "kind" in table.value)
    assert (history["kind"] == "hit").sum() == summary.hits


def test_prefix_tree_colour_size_and_merge_controls() -> None:
    app = go_to(start(), "views/prefix_tree.py")
    merged_nodes = len(values(chart_traces(app)[0][0], "ids"))
    app.toggle(key="prefix_tree_merge").set_value(False).run()
    app.radio(key="prefix_tree_colour").set_value("age").run()
    app.select_slider(key="prefix_tree_size").set_value(100).run()
    assert not app.exception, app.exception
    icicle = chart_traces(app)[0][0]
    assert len(values(icicle, "ids")) == 100 + 1  # a block each, under one root
    with RunFile.open(SAMPLE_RUN) as run_file:
        nodes = prefix_tree.tree_nodes(run_file, time_grid(run_file).whole_run(), 1_000)
    assert merged_nodes == len(prefix_tree.merge_unbranched(nodes)) + 1 < 1_000
    assert icicle["marker"]["colorscale"]


def write_word_tokenizer(folder: Path) -> Path:
    """A real tokenizer on disk, token i being the word "w<i>", for the whole vocabulary."""
    from tokenizers import Tokenizer, models  # noqa: PLC0415 - tokenizers is optional: only token text needs it

    vocabulary = {f"w{index}": index for index in range(32_000)}
    folder.mkdir(parents=True)
    Tokenizer(models.WordLevel(vocabulary, unk_token="w0")).save(str(folder / "tokenizer.json"))
    return folder


def test_prefix_text_needs_token_ids_and_a_local_tokenizer(tmp_path: Path) -> None:
    # The sample run names its tokenizer (Mistral 7B's, as mistral_common ships it): the
    # tree's nodes and the hottest prefixes are text from the start.
    app = go_to(start(), "views/prefix_tree.py")
    assert app.text_input(key="prefix_tree_tokenizer").value == SAMPLE_TOKENIZER
    assert len(app.expander) == 5
    texts = [element.value for element in app.get("text")]
    openings = (*INTROS.values(), "Daily operations report.")
    assert len(texts) == 5 and all(text.startswith(openings) for text in texts)
    labels = values(chart_traces(app)[0][0], "labels")
    assert sum(label.startswith(("You are", "Daily operations")) for label in labels) >= 4
    # No such tokenizer: positions.
    app.text_input(key="prefix_tree_tokenizer").input("kvscope-tests/no-such-model").run()
    assert "Positions, not text: no tokenizer is on this machine" in captions(app)
    assert not app.expander
    assert values(chart_traces(app)[0][0], "labels")[1].startswith("pos 0-")
    # Any tokenizer.json: here token i is the word "w<i>".
    folder = write_word_tokenizer(tmp_path / "tokenizer")
    app.text_input(key="prefix_tree_tokenizer").input(str(folder)).run()
    assert not app.exception, app.exception
    texts = [element.value for element in app.get("text")]
    assert len(texts) == 5 and all(text.startswith("w1 ") for text in texts)  # BOS first
    # The sample's shortest hot prefix is a tenant's system prompt: 22 blocks of 16 tokens.
    assert min(len(text.split()) for text in texts) == 22 * 16
    # Another run starts from the tokenizer it names (the block-32 sample names none), and
    # without token ids it shows positions, whatever the tokenizer.
    app.session_state["run_path"] = str(SECOND_SAMPLE_RUN)
    app.run()
    assert not app.exception, app.exception
    assert app.text_input(key="prefix_tree_tokenizer").value == ""
    app.text_input(key="prefix_tree_tokenizer").input(str(folder)).run()
    assert "the run did not record token ids" in captions(app)


def test_picking_a_prefix_tree_node_zooms_the_tree() -> None:
    app = go_to(start(), "views/prefix_tree.py")
    assert chart_traces(app)[0][0]["level"] == "all"
    app.selectbox(key="prefix_tree_node").select_index(2).run()
    picked = app.selectbox(key="prefix_tree_node").value
    assert picked and chart_traces(app)[0][0]["level"] == picked
    app.selectbox(key="prefix_tree_node").select_index(0).run()
    assert chart_traces(app)[0][0]["level"] == "all"


def test_roi_inputs_change_every_estimate() -> None:
    app = go_to(start(), "views/roi.py")
    before = metrics(app)
    app.number_input(key="roi_dollars_per_gpu_hour").set_value(5.0).run()
    assert not app.exception, app.exception
    with RunFile.open(SAMPLE_RUN) as run_file:
        window = time_grid(run_file).whole_run()
        totals = run_file.row(
            "SELECT count(*), sum(num_prompt_tokens), sum(num_prompt_tokens::BIGINT ** 2), "
            "sum(num_hit_tokens), sum(num_hit_tokens::BIGINT ** 2) "
            "FROM events WHERE kind = 'lookup' AND NOT preempted"
        )
    assert totals is not None
    requests, prompt, prompt_squared, hit, hit_squared = totals
    # By hand, Llama-3.1-8B on an H100 SXM at 40 % MFU: 2 x parameters FLOPs per token, plus
    # 2 x layers x (heads x head size) x h x (h + 1) of causal attention.
    per_second = 989e12 * 0.40

    def seconds(tokens: float, squared: float) -> float:
        return (2 * 8.03e9 * tokens + 2 * 32 * 4096 * (squared + tokens)) / per_second

    uncached_ms = 1000 * seconds(prompt, prompt_squared) / requests
    saved_s = seconds(hit, hit_squared)
    cached_ms = uncached_ms - 1000 * saved_s / requests
    day = 86_400 / window.duration_s
    after = metrics(app)
    assert after["Prefill per request, uncached"] == f"{uncached_ms:,.1f} ms"
    assert after["With the prefix cache"] == f"{cached_ms:,.1f} ms"
    (cached,) = [metric for metric in app.metric if metric.label == "With the prefix cache"]
    cut = (cached_ms - uncached_ms) / uncached_ms
    assert cached.delta == f"{cached_ms - uncached_ms:,.1f} ms ({cut:+.0%})"
    assert after["GPU-hours saved per day"] == f"{saved_s * day / 3600:,.3g}"
    assert after["Saved per day (USD)"] == f"${saved_s * day / 3600 * 5.0:,.2f} a day"
    assert before["Saved per day (USD)"] == f"${saved_s * day / 3600 * 2.5:,.2f} a day"
    assert after["GPU-seconds saved"] == before["GPU-seconds saved"] == f"{saved_s:,.1f}"
    assert "$5.00 (USD) per GPU-hour" in captions(app)
    assert f"{requests:,} requests in {window.duration_s:,.1f} s" in captions(app)
    # The assumptions are stated once, and the prefix chart says how many families it shows.
    assert sum("Assumed:" in caption.value for caption in app.caption) == 1
    with RunFile.open(SAMPLE_RUN) as run_file:
        families = len(roi.prefix_savings(run_file, window, 15))
    assert families < 15
    assert f"(all {families} that were hit are shown)" in captions(app)
    # A model preset fills in its shape; editing one field makes the model "custom".
    app.selectbox(key="roi_model").select("Llama-3.1-70B").run()
    assert app.number_input(key="roi_parameters_billion").value == 70.6
    assert "Llama-3.1-70B: 70.6 B parameters, 80 layers x 64 heads" in captions(app)
    app.number_input(key="roi_num_layers").set_value(40).run()
    assert "custom (Llama-3.1-70B-like): 70.6 B parameters, 40 layers" in captions(app)
    assert float(metrics(app)["GPU-seconds saved"]) > float(before["GPU-seconds saved"])
    # Other pages price with the same assumptions.
    tenants = go_to(app, "views/tenants.py")
    assert "40 layers" in captions(tenants) and "$5.00 (USD) per GPU-hour" in captions(tenants)
    # And coming back, the inputs are as they were left.
    app = go_to(tenants, "views/roi.py")
    assert app.number_input(key="roi_num_layers").value == 40
    assert app.selectbox(key="roi_model").value == "Llama-3.1-70B"


def test_compare_runs_side_by_side() -> None:
    app = go_to(start(), "views/compare.py")
    assert app.selectbox(key="compare_run").options == [
        "run_block32.duckdb",
        "run_hybrid.duckdb",
        "run_tier.duckdb",
    ]
    with RunFile.open(SECOND_SAMPLE_RUN) as run_file:
        second = run_summary(run_file)
    assert metrics(app)["Hit ratio (tokens)"] == f"{second['token_hit_ratio']:.1%}"
    # A ratio's change is in percentage points, not a percentage of a percentage.
    with RunFile.open(SAMPLE_RUN) as run_file:
        first = run_summary(run_file)
    change = (second["token_hit_ratio"] - first["token_hit_ratio"]) * 100
    (token_metric,) = [metric for metric in app.metric if metric.label == "Hit ratio (tokens)"]
    assert token_metric.delta == f"{change:+.1f} pts"
    settings = next(table.value for table in app.dataframe if "setting" in table.value)
    assert settings.loc[settings["differs"], "setting"].tolist() == ["block_size", "num_blocks"]


def test_compare_with_no_other_run(tmp_path: Path) -> None:
    run = tmp_path / "only.duckdb"
    shutil.copy(SAMPLE_RUN, run)
    app = go_to(start(run), "views/compare.py")
    assert "Put another run in" in app.info[0].value
    assert not app.get("plotly_chart")


def test_a_run_not_written_yet_is_waited_for(tmp_path: Path) -> None:
    """The live-capture steps (docs/live-capture.md): the app is opened on the collector's run
    file before the collector's first batch has created it."""
    run = tmp_path / "live.duckdb"
    app = start(run)
    assert app.info[0].value.startswith(
        f"Waiting for the collector's first batch: {run} does not exist yet."
    )
    assert not app.error


def said(app: AppTest) -> str:
    """Everything the page said in metrics, notes and messages."""
    notes = [f"{label}: {value}" for label, value in metrics(app).items()]
    for kind in ("info", "success", "warning", "error", "caption"):
        notes += [element.value for element in app.get(kind)]
    return "\n".join(notes)


@pytest.mark.parametrize(
    ("page", "message"),
    [
        ("views/overview.py", "Nothing happened in this time range."),
        ("views/hotspots.py", "No block was hit, stored or evicted in this time range."),
        ("views/prefix_tree.py", "No block was hit in this time range."),
        ("views/roi.py", "GPU-seconds saved: 0.0"),
        ("views/free_blocks.py", "No pool snapshot in this time range."),
        ("views/kv_groups.py", "This run has one full-attention group"),
        ("views/collisions.py", "0 in 0 block hits checked"),
        ("views/tenants.py", "No block hit in this time range."),
        ("views/fleet.py", "This page needs a run with several engines"),
        ("views/compare.py", "Put another run in"),
    ],
)
def test_pages_on_a_window_with_nothing_in_it(tmp_path: Path, page: str, message: str) -> None:
    # 1-2 ms into the small run: between a0 (0 ms) and b0 (10 ms) nothing happened.
    app = start(shared_prefix_run(tmp_path))
    app.slider(key="time_range").set_range(0.001, 0.002).run()
    app = go_to(app, page)
    assert "0.001-0.002 s of 0.0301 s" in captions(app) or page == "views/compare.py"
    assert message in said(app)


def test_collisions_page_says_when_the_check_was_off(tmp_path: Path) -> None:
    # The check is on by default (with the key-free fingerprints): a run recorded with it off.
    run = tiny_run(tmp_path, SHARED_PREFIX, num_blocks=6, check_collisions=False)
    app = go_to(start(run), "views/collisions.py")
    assert "recorded without the collision check, so no hit was checked" in said(app)
