"""The Requests page (visualizer/views/requests.py) in AppTest on the sample run: a request
found by its id, its tenant or words of its prompt, its lookups and blocks with their causes
adding up to the run's own `lookup_causes` and `request_block_causes`; a request with no
misses says so (tests/support/runs.py: b0 hits its whole shared prefix). And the Overview's
lead: the verdict, the waterfall and the families on the sample run, and the one line a
run of vLLM's KV events alone gets."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from collector.queries.miss_causes import (
    CAUSE_NAMES,
    cause_totals,
    family_losses,
    lookup_causes,
    request_block_causes,
)
from collector.queries.request_search import prompt_token_ids, request_row
from collector.replay.block_manager import CacheSettings
from collector.store.run_file import RunFile
from collector.token_text import SAMPLE_TOKENIZER, load_local_tokenizer
from collector.vllm_kv.conflicts import HashConflictDetector
from collector.vllm_kv.ingest import append_vllm_batches
from tests.support.app import go_to, start
from tests.support.repo import SAMPLE_RUN
from tests.support.runs import shared_prefix_run
from tests.support.vllm_kv_pipeline import H, events_run, received, stored
from tests.test_app import values
from visualizer.miss_breakdown import NO_LOOKUPS

PAGE = "views/requests.py"
PREEMPTED = "report-14"  # in the sample: its first admission diverged, then it was preempted


def search(app: AppTest, text: str) -> AppTest:
    app.text_input(key="requests_search").input(text).run()
    assert not app.exception, app.exception
    return app


def picker(app: AppTest) -> Any:
    """The select box of the requests found (a box of its own for each search)."""
    (box,) = [box for box in app.selectbox if str(box.key).startswith("requests_pick:")]
    return box


def options(app: AppTest) -> list[str]:
    """The request ids the picker offers (each option starts with its id)."""
    return [option.split(" · ")[0] for option in picker(app).options]


def table(app: AppTest, index: int) -> pd.DataFrame:
    """The page's `index`-th table, in page order."""
    return app.dataframe[index].value


def tenant_of(run: RunFile, request: str) -> str | None:
    row = request_row(run, request)
    assert row is not None, request
    tenant: str | None = row["tenant"]
    return tenant


@pytest.fixture(scope="module")
def sample() -> RunFile:
    return RunFile.open(SAMPLE_RUN)


@pytest.fixture(scope="module")
def preempted_page() -> AppTest:
    return search(go_to(start(), PAGE), PREEMPTED)


def test_a_request_found_by_its_id_shows_its_lookups_causes(
    sample: RunFile, preempted_page: AppTest
) -> None:
    app = preempted_page
    assert picker(app).value == PREEMPTED
    assert options(app)[0] == PREEMPTED
    assert f"Request {PREEMPTED}" in [header.value for header in app.subheader]
    causes = lookup_causes(sample, PREEMPTED)
    lookups = table(app, 0)
    assert lookups["lookup"].tolist() == ["first admission", "after preemption 1"]
    for row, (_seq, own) in zip(lookups.to_dict("records"), causes.groupby("seq"), strict=True):
        shown = {name: row[name] for name in CAUSE_NAMES.values() if row.get(name)}
        expected = {
            CAUSE_NAMES[cause]: tokens
            for cause, tokens in zip(own["cause"], own["tokens"], strict=True)
        }
        assert shown == expected


def test_every_missed_block_is_shown_with_its_cause_and_who_evicted_it(
    sample: RunFile, preempted_page: AppTest
) -> None:
    blocks = table(preempted_page, 1)
    causes = lookup_causes(sample, PREEMPTED)
    names = {"first admission": False, "after preemption 1": True}
    shown: Counter[tuple[bool, str]] = Counter()
    for row in blocks.to_dict("records"):
        shown[names[row["lookup"]], row["cause"]] += row["tokens"]
    assert shown == Counter(
        {
            (preempted, CAUSE_NAMES[cause]): tokens
            for preempted, cause, tokens in zip(
                causes["preempted"], causes["cause"], causes["tokens"], strict=True
            )
        }
    )
    # Blocks alike side by side are one row; each preempted block's evictor is named.
    missed = request_block_causes(sample, PREEMPTED)
    preempted = missed[missed["cause"] == "preempted"]
    lost = blocks[blocks["cause"] == CAUSE_NAMES["preempted"]]
    assert len(preempted) == 10 and lost["tokens"].sum() == 160
    assert lost["where"].iloc[0].startswith("block 28") and lost["where"].iloc[-1].endswith("37")
    for evictor in preempted["evicted_by"]:
        tenant = tenant_of(sample, evictor)
        assert any(f"by {evictor} (tenant {tenant})" in detail for detail in lost["detail"])
    diverged = blocks[blocks["cause"] == CAUSE_NAMES["diverged"]]
    assert diverged[["where", "tokens"]].to_numpy().tolist() == [["blocks 1-37", 592]]
    # The sample recorded token ids: each block's text is its tokens' text.
    tokenizer = load_local_tokenizer(SAMPLE_TOKENIZER)
    prompt = prompt_token_ids(sample, PREEMPTED)
    assert tokenizer is not None and prompt is not None
    first = blocks.iloc[0]
    assert first["text"] == tokenizer.decode(prompt[: first["tokens"]])
    assert first["text"].startswith("Daily operations report")


def test_a_search_by_tenant_offers_that_tenants_requests(sample: RunFile) -> None:
    app = search(go_to(start(), PAGE), "initech")
    ids = options(app)
    assert len(ids) == 149  # the sample's initech requests (all under the page's 200)
    assert {tenant_of(sample, request) for request in ids} == {"initech"}
    assert f"Request {ids[0]}" in [header.value for header in app.subheader]


def test_a_search_by_prompt_words_finds_the_prompts_that_hold_them(sample: RunFile) -> None:
    app = search(go_to(start(), PAGE), "Acme Hardware")
    ids = options(app)
    assert ids
    tokenizer = load_local_tokenizer(SAMPLE_TOKENIZER)
    assert tokenizer is not None
    for request in ids[:20]:
        prompt = prompt_token_ids(sample, request)
        assert prompt is not None and "Acme Hardware" in tokenizer.decode(prompt)
    matched = picker(app).options[0]
    assert matched.endswith("matched on prompt text")


def test_a_request_with_no_misses_says_so(tmp_path: Path) -> None:
    run = shared_prefix_run(tmp_path)
    app = search(go_to(start(run), PAGE), "b0")
    (success,) = app.success
    assert success.value.startswith("No misses: every full block of the prompt was served")
    assert "last 4 tokens" in success.value
    assert table(app, 0)["hit"].tolist() == [8]


def test_no_match_says_what_was_searched() -> None:
    app = search(go_to(start(), PAGE), "no-such-request-anywhere")
    assert [info.value for info in app.info] == [
        "No request's id, tenant or prompt holds “no-such-request-anywhere”."
    ]


def test_the_overview_leads_with_the_verdict_and_the_waterfall(sample: RunFile) -> None:
    app = start()
    totals = cause_totals(sample)
    hit = float(totals.loc[totals["cause"] == "hit", "share"].iloc[0])
    # The health scorecard comes first (tests/test_health.py), then the miss breakdown.
    assert [header.value for header in app.subheader[:1]] == ["Health"]
    verdict = app.subheader[1].value
    assert verdict.startswith(f"{hit:.1%} of prompt tokens were served from the cache")
    assert "the biggest loss is diverged from a cached prefix" in verdict
    diverged = int(totals.loc[totals["cause"] == "diverged", "tokens"].iloc[0])
    assert any(  # diverged tokens lead to the Advisor's dynamic-field rule
        caption.value.startswith(f"Diverged prefixes ({diverged:,} tokens)")
        and "dynamic-field rule" in caption.value
        for caption in app.caption
    )
    waterfall, families = (json.loads(chart.proto.spec) for chart in app.get("plotly_chart")[:2])
    (bars,) = waterfall["data"]
    shown = totals[totals["tokens"] > 0]
    assert bars["y"] == [
        *(CAUSE_NAMES[cause] for cause in shown["cause"]),
        "prompt tokens looked up",
    ]
    assert values(bars, "x") == [*shown["tokens"], totals["tokens"].sum()]
    # Families by the start of their text, never by a hash; their tokens are the run's.
    labels = {label for trace in families["data"] for label in trace["y"]}
    assert len(labels) == 5 and all(label.startswith("“") for label in labels)
    assert not any(re.search(r"\b[0-9a-f]{8}\b", label) for label in labels)
    losses = family_losses(sample)
    assert sum(sum(values(trace, "x")) for trace in families["data"]) == losses["tokens"].sum()


def test_a_run_of_vllm_kv_events_alone_gets_one_line(tmp_path: Path) -> None:
    path = tmp_path / "run.duckdb"
    run = events_run(path, CacheSettings(4, 5))
    append_vllm_batches(run, [received(0, stored(H, [1, 2, 3, 4]))], [], HashConflictDetector())
    run.finalize()
    run.close()
    app = start(path)
    assert NO_LOOKUPS in [caption.value for caption in app.caption]
