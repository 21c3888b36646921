"""The shipped Prometheus alerting rules: promtool checks them and runs their unit tests, and a
real Prometheus server (Debian's `prometheus`) scraping a real collector fires the free-blocks
alert for an engine whose pool is too small for its requests, and not for one whose pool is
large enough."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from collector.replay.block_manager import CacheSettings, make_block_hasher, make_kv_cache_manager
from collector.replay.simulator import VirtualClock, vllm_request
from collector.replay.traces import read_trace
from engine_hooks import EventBuffer, KVCacheHooks, Pseudonymizer
from engine_hooks.transport import Transport
from tests.support.engine import collector_process, wait_for
from tests.support.ports import free_port
from tests.support.repo import REPO, SAMPLE_TRACE

RULES = REPO / "docs" / "prometheus" / "kvscope-alerts.yml"
RULE_TESTS = REPO / "docs" / "prometheus" / "kvscope-alerts.test.yml"
RUNBOOK = REPO / "docs" / "prometheus" / "runbook.md"
# The test copy's `for:`: long enough to need two evaluations, short enough for a test.
TEST_FOR = "3s"
# The sample trace's first 200 requests, up to 32 of them in flight (the oldest finishes
# first, or when the next does not fit): 600 blocks end 4.7 % free, 20,000 end 93 % free.
NUM_REQUESTS = 200
MAX_IN_FLIGHT = 32
SMALL_POOL = 600
LARGE_POOL = 20_000
FREE_SHARE = (
    'kvscope_kv_cache_blocks{state="free"} / on(engine, dp_rank) kvscope_kv_cache_pool_blocks'
)


def promtool(*arguments: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("promtool") is None:
        pytest.fail("promtool is missing: .ci/setup --browser installs Debian's prometheus")
    return subprocess.run(
        ["promtool", *arguments], capture_output=True, text=True, check=False, timeout=120
    )


def test_promtool_checks_the_rules() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 9 rules found" in result.stdout


def test_every_alert_fires_and_stays_quiet_in_promtools_unit_tests() -> None:
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    tested = set(re.findall(r"alertname: (\w+)", RULE_TESTS.read_text()))
    assert tested == set(_alerts()), set(_alerts()) - tested


def test_every_alert_links_its_runbook_entry() -> None:
    headings = set(re.findall(r"^## (\w+)$", RUNBOOK.read_text(), re.MULTILINE))
    for name, rule in _alerts().items():
        assert rule["annotations"]["runbook_url"] == f"docs/prometheus/runbook.md#{name.lower()}"
        assert name in headings, name


def _alerts() -> dict[str, dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


@pytest.mark.slow
@pytest.mark.vllm
def test_a_real_prometheus_fires_the_free_blocks_alert_for_a_pool_too_small(
    tmp_path: Path,
) -> None:
    metrics_port = free_port()
    endpoint = f"ipc://{tmp_path}/collect.ipc"
    with (
        collector_process(tmp_path / "run.duckdb", endpoint, "--metrics-port", str(metrics_port)),
        prometheus_server(tmp_path, metrics_port) as api,
    ):
        small, small_engine = hold_requests(endpoint, "small", SMALL_POOL)
        large, large_engine = hold_requests(endpoint, "large", LARGE_POOL)
        assert small < 0.10 < large  # as the hooks saw each pool after its last step
        # The small engine's alert goes pending, then fires once it held for TEST_FOR.
        wait_for(lambda: _alert_states(api) == {"small": "firing"}, timeout_s=120)
        # Prometheus holds both pools as the hooks left them; once it has scraped the large
        # one's for longer than TEST_FOR (and evaluated the rules each second), it is quiet.
        ratios = _query(api, FREE_SHARE)
        assert ratios == {"small": pytest.approx(small), "large": pytest.approx(large)}
        wait_for(lambda: _query(api, f"count_over_time(({FREE_SHARE})[1m:1s])")["large"] >= 8)
        assert _alert_states(api) == {"small": "firing"}
        # The small engine shuts down (a planned restart), its requests still in flight: its
        # closing batch ends its series, and the alert resolves instead of paging on.
        small_engine.stop()
        wait_for(lambda: _alert_states(api) == {}, timeout_s=60)
        assert _query(api, FREE_SHARE) == {"large": pytest.approx(large)}
        large_engine.stop()


def hold_requests(endpoint: str, engine_id: str, num_blocks: int) -> tuple[float, Transport]:
    """The sample trace's first requests through vLLM's real manager in a pool of
    `num_blocks`, hooks attached, shipped to the collector as an engine does; the requests
    in flight at the end stay in flight. Returns the pool's free share after the last step,
    and the engine's transport, still sending: its `stop()` is the engine's shutdown (its
    closing batch, as the plugin's, says where its stream ended and when it stopped)."""
    settings = CacheSettings(16, num_blocks)
    manager = make_kv_cache_manager(settings)
    buffer = EventBuffer()
    clock = VirtualClock()
    hooks = KVCacheHooks(manager, buffer, pseudonymizer=Pseudonymizer(b"k"), clock=clock)
    hooks.attach()
    config = {
        "block_size": 16,
        "num_blocks": num_blocks,
        "hash_algo": "sha256",
        "vllm_version": "0",
    }
    transport = Transport(
        buffer,
        endpoint,
        engine_id=engine_id,
        config=config,
        next_seq=lambda: hooks.num_records,
        clock=clock,
    ).start()
    block_hasher = make_block_hasher(settings)
    in_flight: deque[Any] = deque()

    def finish_oldest() -> None:
        request = in_flight.popleft()
        manager.free(request)
        hooks.on_finish(request)

    for trace_request in read_trace(SAMPLE_TRACE)[:NUM_REQUESTS]:
        clock.set_ms(trace_request.timestamp_ms)
        request = vllm_request(trace_request, block_hasher)
        hooks.on_arrive(request, tenant=trace_request.tenant)
        while True:  # as the scheduler does: look the prefix up, allocate the prefill
            blocks, num_hit_tokens, boundary = manager.get_computed_blocks(request)
            request.shared_prefix_boundary = boundary
            new_tokens = request.num_tokens - num_hit_tokens
            if manager.allocate_slots(request, new_tokens, num_hit_tokens, blocks) is not None:
                break
            finish_oldest()
        in_flight.append(request)
        if len(in_flight) > MAX_IN_FLIGHT:
            finish_oldest()
        hooks.record_pool_state()
    wait_for(lambda: transport.num_delivered == hooks.num_records)
    return float(manager.block_pool.get_num_free_blocks() / (num_blocks - 1)), transport


@contextmanager
def prometheus_server(folder: Path, metrics_port: int) -> Iterator[str]:
    """Debian's Prometheus on a free loopback port, a fresh data folder, scraping the
    collector every second and evaluating the shipped rules every second, their `for:`
    made TEST_FOR in the test's copy; yields its API's base URL."""
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus is missing: .ci/setup --browser installs Debian's prometheus")
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = TEST_FOR
    (folder / "rules.yml").write_text(yaml.safe_dump(rules))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(folder / "rules.yml")],
        "scrape_configs": [
            {
                "job_name": "kvscope",
                "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}],
            }
        ],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    with (folder / "prometheus.log").open("w") as log:
        process = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    api = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(api, process), timeout_s=60)
        yield api
    finally:
        process.terminate()
        process.wait(timeout=30)


def _ready(api: str, process: subprocess.Popen[bytes]) -> bool:
    assert process.poll() is None, "prometheus exited; see prometheus.log in the test's folder"
    try:
        with urllib.request.urlopen(f"{api}/-/ready", timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _get(api: str, path: str) -> Any:
    with urllib.request.urlopen(f"{api}{path}", timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]


def _alert_states(api: str) -> dict[str, str]:
    """The engine and state (pending, firing) of each KvscopeFreeBlocksLow alert."""
    return {
        alert["labels"]["engine"]: alert["state"]
        for alert in _get(api, "/api/v1/alerts")["alerts"]
        if alert["labels"]["alertname"] == "KvscopeFreeBlocksLow"
    }


def _query(api: str, expression: str) -> dict[str, float]:
    """An instant query's value per engine."""
    query = urllib.parse.urlencode({"query": expression})
    result = _get(api, f"/api/v1/query?{query}")["result"]
    return {sample["metric"]["engine"]: float(sample["value"][1]) for sample in result}
