"""`kvscope whatif --ray`: a sweep's points as tasks on a real local Ray instance give what the
local process pool gives, point for point and run file for run file."""

from __future__ import annotations

import os
import pickle
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from collector.cli import main
from collector.replay.traces import TraceError
from collector.replay.whatif import read_results
from collector.store.run_file import RunFile
from tests.support.ports import free_port
from tests.support.repo import SAMPLE_TRACE

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version

# What differs between two replays of one trace: the run's identity and when it ran
# (tests/test_sample_replay.py).
RUN_IDENTITY = {"run_id", "trace", "started_at", "finished_at"}

# The sample's first 200 requests, sequential: two block sizes, two pools, and each pool
# again as two engines behind round-robin and behind prefix-affinity.
SWEEP = ["--block-size", "16,32", "--num-blocks", "300,600", "--timing", "sequential"]
SWEEP += ["--engines", "1,2", "--routers", "round-robin,prefix-affinity", "--limit", "200"]


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """A Ray head of 2 CPUs on free ports, started for this module and stopped after it."""
    with ray_head(os.environ) as address:
        yield address


@contextmanager
def ray_head(environment: Mapping[str, str], num_cpus: int = 2) -> Iterator[str]:
    """A Ray head on free ports in `environment`, its address; stopped after the block."""
    pytest.importorskip("ray")
    # Ray's unix sockets live under its temp dir: keep the path short (108 bytes at most).
    temp_dir = Path(tempfile.mkdtemp(prefix="kvray-", dir="/tmp"))
    port = free_port()
    ports = {
        "--port": port,
        "--ray-client-server-port": free_port(),
        "--dashboard-port": free_port(),
        "--dashboard-agent-listen-port": free_port(),
        "--dashboard-agent-grpc-port": free_port(),
        "--metrics-export-port": free_port(),
        "--runtime-env-agent-port": free_port(),
    }
    command = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block"]
    command += ["--node-ip-address", "127.0.0.1", "--num-cpus", str(num_cpus)]
    command += ["--temp-dir", str(temp_dir), "--include-dashboard", "false"]
    command += ["--disable-usage-stats", *(str(item) for pair in ports.items() for item in pair)]
    log = temp_dir / "start.log"
    # Its own session: teardown signals this instance's processes and no one else's (`ray
    # stop` would stop every Ray instance on the machine).
    with log.open("w") as output:
        head = subprocess.Popen(
            command,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(environment),
        )
    try:
        _wait_until_started(head, log)
        yield f"127.0.0.1:{port}"
    finally:
        _stop(head)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _wait_until_started(head: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while "Ray runtime started" not in log.read_text():
        if head.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"ray start did not start:\n{log.read_text()}")
        time.sleep(0.5)


def _stop(head: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the instance's process group, SIGKILL to what is left after 5 s."""
    for signal_number, grace_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(head.pid, signal_number)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            head.poll()
            try:
                os.killpg(head.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def sweep(out: Path, *options: str) -> tuple[list[dict[str, Any]], float]:
    """Run the sweep through the CLI; its results (seconds left out) and its wall time."""
    started = time.perf_counter()
    assert main(["whatif", str(SAMPLE_TRACE), "--out", str(out), *SWEEP, "--quiet", *options]) == 0
    seconds = time.perf_counter() - started
    results = [result.to_json() for result in read_results(out).results]
    return [{name: row[name] for name in row if name != "seconds"} for row in results], seconds


def tables(run: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every table of a run file, its rows in order, the run's identity left out."""
    with RunFile.open(run) as run_file:
        contents = {}
        for (table,) in run_file.rows("SHOW TABLES"):
            columns = [row[0] for row in run_file.rows(f"DESCRIBE {table}")]
            kept = ", ".join(f'"{column}"' for column in columns if column not in RUN_IDENTITY)
            contents[table] = run_file.rows(f"SELECT {kept} FROM {table} ORDER BY ALL")
    return contents


@pytest.mark.slow  # starts a Ray instance; both sweeps import vLLM in two workers each
def test_a_sweep_on_ray_equals_the_local_pool_point_for_point(
    tmp_path: Path, ray_address: str
) -> None:
    local, local_s = sweep(tmp_path / "local", "--jobs", "2")
    on_ray, ray_s = sweep(tmp_path / "ray", "--ray", ray_address)
    print(f"12 points: local pool of 2 processes {local_s:.1f} s, Ray of 2 CPUs {ray_s:.1f} s")
    assert on_ray == local
    assert len(local) == 12
    names = sorted(path.name for path in (tmp_path / "local").iterdir())
    assert sorted(path.name for path in (tmp_path / "ray").iterdir()) == names  # no leftovers
    for row in local:
        assert tables(tmp_path / "ray" / row["run"]) == tables(tmp_path / "local" / row["run"])
    # The fleet points: prefix-affinity keeps each prefix on one engine and hits more.
    fleets = {(row["block_size"], row["num_blocks"], row["router"]): row for row in local}
    for block_size in (16, 32):
        for num_blocks in (300, 600):
            affinity = fleets[(block_size, num_blocks, "prefix-affinity")]
            round_robin = fleets[(block_size, num_blocks, "round-robin")]
            assert affinity["engines"] == round_robin["engines"] == 2
            assert affinity["token_hit_ratio"] > round_robin["token_hit_ratio"]
    assert "bs16-blocks300-seqs256-engines2-prefix-affinity.duckdb" in names


def test_kvscopes_refusal_on_a_ray_node_reaches_the_driver_whole() -> None:
    # Ray pickles what a task raises; the driver re-raises kvscope's own errors as they
    # were, so a sweep on Ray refuses as the local pool does (TraceError: file, line, reason).
    error = pickle.loads(pickle.dumps(TraceError(SAMPLE_TRACE, 7, "needs 'token_ids'")))
    assert isinstance(error, TraceError)
    assert (error.path, error.line, error.reason) == (SAMPLE_TRACE, 7, "needs 'token_ids'")
    assert str(error) == f"{SAMPLE_TRACE}:7: needs 'token_ids'"


def test_an_address_nobody_answers_is_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("ray")
    out = tmp_path / "sweep"
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    assert main(["whatif", str(SAMPLE_TRACE), "--out", str(out), "--ray", address]) == 2
    assert time.monotonic() - started < 30  # ray.init alone retries for minutes
    assert f"kvscope: error: no Ray cluster answers at {address}" in capsys.readouterr().err
    assert not out.exists()


def test_without_ray_the_sweep_says_how_to_install_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    out = tmp_path / "sweep"
    assert main(["whatif", str(SAMPLE_TRACE), "--out", str(out), "--ray"]) == 2
    error = capsys.readouterr().err
    assert "--ray runs the sweep's points as Ray tasks" in error
    assert "pip install 'kvscope[ray]'" in error
    assert not out.exists()


@pytest.mark.slow  # starts a Ray instance that wants a token; the sweep on it imports vLLM
def test_a_cluster_that_wants_another_token_is_refused_with_what_to_do(tmp_path: Path) -> None:
    # A cluster in token mode, as `ray start` makes where ~/.ray/auth_token exists: a driver
    # without the token meets Ray's refusal; kvscope says what to do, in one line, and exits 2.
    token = secrets.token_hex(16)
    with ray_head({**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}, 1) as address:
        out = tmp_path / "sweep"
        command = [str(Path(sys.executable).parent / "kvscope"), "whatif", str(SAMPLE_TRACE)]
        command += ["--out", str(out), "--block-size", "16", "--num-blocks", "300"]
        command += ["--limit", "20", "--quiet", "--ray", address]
        # Ray retries a refused connection once a second for 20 s: twice is enough here.
        environment = {**os.environ, "RAY_gcs_server_port_wait_time_s": "2"}
        refused = subprocess.run(
            command, capture_output=True, text=True, env=environment, check=False
        )
        assert refused.returncode == 2
        error = [line for line in refused.stderr.splitlines() if line.startswith("kvscope:")]
        assert error == [
            f"kvscope: error: the Ray cluster at {address} refused this driver: its "
            "authentication token is missing or not the cluster's. A Ray started where "
            "~/.ray/auth_token exists requires that token (a local Ray, as `kvscope whatif "
            "--ray` without an address starts, writes one); run again with RAY_AUTH_MODE=token "
            "and the cluster's token in ~/.ray/auth_token (or RAY_AUTH_TOKEN), or delete "
            "~/.ray/auth_token and restart the cluster"
        ]
        assert "Traceback" not in refused.stderr
        assert not out.exists()

        # What it says to do works: the driver given the cluster's token runs the sweep.
        environment |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
        done = subprocess.run(command, capture_output=True, text=True, env=environment, check=False)
        assert done.returncode == 0, done.stderr
        assert len(read_results(out).results) == 1
