"""Live capture inside a real vLLM server serving a hybrid model: a random-weight Gemma 2 with
a sliding-window layer and a full-attention layer, so vLLM's hybrid allocator keeps two KV
cache groups in one pool (as for gpt-oss and Gemma 3). A real `kvscope collect` receives
kvscope's records and vLLM's own KV events; what vLLM reports is compared with the run."""

from __future__ import annotations

import json
import random
import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from collector.store.run_file import RunFile
from tests.support.engine import collector_process
from tests.support.repo import SECRET
from tests.support.vllm_server import (
    BLOCK_SIZE,
    SLIDING_WINDOW,
    TOKEN_RANGE,
    Completion,
    VllmServer,
    build_hybrid_model,
    engine_environment,
)

pytestmark = pytest.mark.slow

NUM_BLOCKS = 160  # both groups hold blocks of every request: 2 x 32 for one 1024-token prompt


@dataclass
class HybridRun:
    run: Path
    completions: list[Completion] = field(default_factory=list)
    server_log: str = ""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> HybridRun:
    folder = tmp_path_factory.mktemp("hybrid")
    model = build_hybrid_model(folder / "tiny-gemma2")
    kv_events = f"ipc://{folder}/kv-events.ipc"
    endpoint = f"ipc://{folder}/kvscope.ipc"
    result = HybridRun(folder / "run.duckdb")
    kv_events_config = json.dumps(
        {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": kv_events, "topic": "kv"}
    )
    environment = engine_environment(
        KVSCOPE_CAPTURE="1", KVSCOPE_ENDPOINT=endpoint, KVSCOPE_SECRET=SECRET.decode()
    )
    collect_args = ("--vllm-kv-events", kv_events, "--vllm-kv-topic", "kv", "--block-size", "32")
    with collector_process(result.run, endpoint, *collect_args) as collector:
        server = VllmServer(
            model,
            folder / "vllm.log",
            ["--kv-events-config", kv_events_config],
            environment,
            num_blocks=NUM_BLOCKS,
        )
        try:
            server.wait_until_up()
            rng = random.Random(12)
            system = [rng.randrange(*TOKEN_RANGE) for _ in range(300)]
            for index in range(30):  # one at a time: each request's hit is the same
                question = [rng.randrange(*TOKEN_RANGE) for _ in range(rng.randrange(20, 200))]
                prompt = system + question if index % 3 else question + system
                result.completions.append(server.complete(prompt, 16))
            for _ in range(6):  # long prompts: the pool runs out and blocks are evicted
                long_prompt = [rng.randrange(*TOKEN_RANGE) for _ in range(900)]
                result.completions.append(server.complete(long_prompt, 8))
            result.completions.append(server.complete([*system, 101, 102, 103], 4))
        finally:
            server.stop(signal.SIGTERM)
            result.server_log = server.log()
        collector.send_signal(signal.SIGTERM)
        collector.wait(timeout=120)
    return result


def test_the_run_names_vllms_two_groups(served: HybridRun) -> None:
    with RunFile.open(served.run) as run_file:
        options = json.loads(run_file.record("SELECT options FROM runs")["options"])
    groups = [(group["kind"], group["window"]) for group in options["kv_groups"]]
    assert groups == [("sliding_window", SLIDING_WINDOW), ("full", 0)]
    assert all(group["block_size"] == BLOCK_SIZE for group in options["kv_groups"])


def test_every_request_is_captured_with_vllms_own_cached_tokens(served: HybridRun) -> None:
    with RunFile.open(served.run) as run_file:
        rows = run_file.rows("SELECT request_id, num_prompt_tokens, num_hit_tokens FROM requests")
    assert len(rows) == len(served.completions)
    for completion in served.completions:
        matches = [row for row in rows if row[0].startswith(completion.response_id + "-")]
        assert len(matches) == 1
        assert matches[0][1:] == (completion.prompt_tokens, completion.cached_tokens)
    assert sum(completion.cached_tokens for completion in served.completions) > 0


def test_stores_and_evictions_per_group_equal_vllms_own_kv_events(served: HybridRun) -> None:
    with RunFile.open(served.run) as run_file:

        def pairs(query: str) -> list[tuple[int, int]]:
            return [(int(row[0]), int(row[1])) for row in run_file.rows(query)]

        order = "ORDER BY seq, pos"
        stored = pairs(f"SELECT kv_group, block_hash FROM events WHERE kind = 'store' {order}")
        evicted = pairs(f"SELECT kv_group, block_hash FROM events WHERE kind = 'evict' {order}")
        vllm_order = "ORDER BY seq, event_index, block_position"
        vllm_stored = pairs(
            f"SELECT group_idx, block_hash FROM vllm_kv_events WHERE kind = 'stored' {vllm_order}"
        )
        vllm_removed = pairs(
            f"SELECT group_idx, block_hash FROM vllm_kv_events WHERE kind = 'removed' {vllm_order}"
        )
        window_hits = run_file.row(
            "SELECT count(*), min(block_position) FROM events WHERE kind = 'hit' AND kv_group = 0"
        )
        drops = run_file.row("SELECT count(*) FROM events WHERE kind = 'drop'")
    assert drops == (0,)
    assert {group for group, _ in stored} == {0, 1}
    assert stored == vllm_stored
    assert len(evicted) > 0 and evicted == vllm_removed
    # The sliding-window group reuses only the blocks its window still reads.
    assert window_hits is not None and window_hits[0] > 0 and window_hits[1] > 0
