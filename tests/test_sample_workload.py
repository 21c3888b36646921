"""`kvscope generate`'s workload: English prompts tokenized by Mistral 7B's tokenizer (as the
mistral_common package ships it), whose defaults reproduce the committed sample trace."""

from __future__ import annotations

import gzip
from pathlib import Path

from collector.replay.sample_text import INTROS
from collector.replay.workload import BEGIN, WorkloadShape, generate, write_trace
from collector.token_text import SAMPLE_TOKENIZER, load_local_tokenizer
from tests.support.repo import SAMPLE_TRACE


def test_the_defaults_reproduce_the_committed_trace(tmp_path: Path) -> None:
    written = tmp_path / "trace.jsonl.gz"
    write_trace(generate(WorkloadShape()), written)
    assert written.read_bytes() == SAMPLE_TRACE.read_bytes()


def test_prompts_are_english_text_in_a_real_tokenizer() -> None:
    tokenizer = load_local_tokenizer(SAMPLE_TOKENIZER)
    assert tokenizer is not None
    assert tokenizer.encode("Hello world") == [22557, 1526]  # Mistral 7B's ids
    rows = generate(WorkloadShape(seed=3, num_chats=6, num_rag_requests=6, num_reports=3))
    for row in rows:
        assert row["token_ids"][0] == BEGIN
        text = tokenizer.decode(row["token_ids"])
        if row["request_id"].startswith("report-"):
            assert text.startswith("Daily operations report. Generated at 2026-11-29 ")
            assert "Write the daily operations report for the store managers" in text
        else:
            assert text.startswith(INTROS[row["tenant"]]), row["request_id"]
            assert "\n\nUser: " in text
            assert ("\n\nDocument " in text) == row["request_id"].startswith("rag-")


def test_a_chat_turn_extends_the_previous_turn_and_its_answer() -> None:
    rows = {row["request_id"]: row for row in generate(WorkloadShape(seed=3, num_chats=4))}
    first, second = rows["chat-0-turn-0"], rows["chat-0-turn-1"]
    before = first["token_ids"] + first["output_token_ids"]
    assert second["token_ids"][: len(before)] == before
    assert len(second["token_ids"]) > len(before)


def test_daily_reports_differ_only_in_their_timestamp() -> None:
    reports = [
        row["token_ids"]
        for row in generate(WorkloadShape(seed=3, num_reports=5))
        if row["request_id"].startswith("report-")
    ]
    tokenizer = load_local_tokenizer(SAMPLE_TOKENIZER)
    assert tokenizer is not None
    header = len(tokenizer.encode("Daily operations report.")) + 1
    stamp = len(tokenizer.encode("Generated at 2026-11-29 00:00:00 UTC."))
    instructions = slice(header + stamp, header + stamp + 400)
    assert len({tuple(report[:header]) for report in reports}) == 1
    assert len({tuple(report[header : header + stamp]) for report in reports}) == len(reports)
    assert len({tuple(report[instructions]) for report in reports}) == 1


def test_the_committed_trace_is_gzip_of_jsonl() -> None:
    lines = gzip.decompress(SAMPLE_TRACE.read_bytes()).decode().splitlines()
    assert len(lines) == 500
