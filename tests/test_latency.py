"""Latency by hit share (collector/queries/latency.py) on the sample run, a replay through
vLLM's Scheduler: every request's modelled queue time and TTFT follow from its own records,
the percentiles by bucket from those, `kvscope summary --json` carries them, the Overview
says them in a sentence, labelled modelled, and the Requests page times the request it shows."""

from __future__ import annotations

import json

import duckdb
import pytest

from collector.cli import main
from collector.queries.latency import BUCKETS, Latency, latency_sentence, request_latency
from collector.store.run_file import RunFile
from tests.support.app import go_to, start
from tests.support.repo import SAMPLE_RUN

PREEMPTED = "report-14"  # in the sample: its first admission diverged, then it was preempted


@pytest.fixture(scope="module")
def latency() -> Latency:
    with RunFile.open(SAMPLE_RUN) as run:
        return request_latency(run)


def test_each_request_is_timed_from_its_own_records(latency: Latency) -> None:
    with duckdb.connect(str(SAMPLE_RUN), read_only=True) as connection:
        rows = connection.execute(
            """SELECT request_id,
                min(ts_ns) FILTER (WHERE kind = 'arrive'),
                min(ts_ns) FILTER (WHERE kind = 'schedule'),
                min(ts_ns) FILTER (WHERE kind = 'first_token'),
                count(*) FILTER (WHERE kind = 'first_token'),
                count(*) FILTER (WHERE kind = 'finish')
            FROM events WHERE request_id IS NOT NULL GROUP BY ALL"""
        ).fetchall()
    assert all(row[4] == row[5] == 1 for row in rows), "one first token per finished request"
    expected = {row[0]: ((row[2] - row[1]) / 1e6, (row[3] - row[1]) / 1e6) for row in rows}
    requests = latency.requests
    assert latency.clock == "modelled"
    assert len(requests) == len(rows) == 500
    for row in requests.itertuples():
        assert (row.queue_ms, row.ttft_ms) == pytest.approx(expected[row.request_id])
        assert 0 <= row.queue_ms <= row.ttft_ms
        assert row.num_prefill_tokens >= row.num_prompt_tokens - row.num_cached_tokens


def test_percentiles_by_hit_share(latency: Latency) -> None:
    requests = latency.requests
    table = latency.by_hit_share.set_index("hit_share")
    assert list(table.index) == [bucket for bucket in BUCKETS if bucket in set(requests.hit_share)]
    assert table["requests"].sum() == len(requests)
    for bucket, row in table.iterrows():
        ttft = requests.loc[requests.hit_share == bucket, "ttft_ms"]
        assert row.p50_ttft_ms == pytest.approx(ttft.median())
        assert row.p50_ttft_ms <= row.p90_ttft_ms <= row.p99_ttft_ms
    misses = requests[requests.hit_share == "none cached"]
    assert (misses.num_cached_tokens == 0).all()
    sentence = latency_sentence(latency)
    assert sentence.startswith("Modelled: requests with ")
    assert "for full misses" in sentence


def test_summary_json_carries_the_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(SAMPLE_RUN), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)["latency"]
    assert figures["clock"] == "modelled" and figures["requests"] == 500
    buckets = [row["hit_share"] for row in figures["by_hit_share"]]
    assert buckets[0] == "none cached" and set(buckets) <= set(BUCKETS)
    assert all(row["p50_ttft_ms"] > 0 for row in figures["by_hit_share"])
    assert main(["summary", str(SAMPLE_RUN)]) == 0
    assert "latency by hit share: Modelled: requests with" in capsys.readouterr().out


def test_the_overview_says_it_in_a_sentence(latency: Latency) -> None:
    app = start(SAMPLE_RUN, timeout_s=180)
    subheaders = [element.value for element in app.subheader]
    assert "Latency by hit share (modelled)" in subheaders
    shown = [element.value for element in app.markdown]
    assert latency_sentence(latency) in shown


def test_the_requests_page_times_the_request_it_shows(latency: Latency) -> None:
    app = go_to(start(SAMPLE_RUN, timeout_s=180), "views/requests.py")
    app.text_input(key="requests_search").input(PREEMPTED).run()
    assert not app.exception, app.exception
    row = latency.requests.set_index("request_id").loc[PREEMPTED]
    timing = (
        f"Queued {row.queue_ms:,.1f} ms, first token after {row.ttft_ms:,.1f} ms (modelled, "
        f"{row.num_prefill_tokens:,} prompt tokens computed)."
    )
    assert any(caption.value.endswith(timing) for caption in app.caption), timing
