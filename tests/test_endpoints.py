"""Private by default: the collector's socket sits in a folder only its owner can use, a
squatted or shared one is refused on both sides, so is an abstract socket (unless allowed),
TCP without a token and port 0; a busy endpoint or metrics port is a clear error, other
machines are refused unless the collector allows them and engines show a token."""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collector.live.receiver import INGEST_MEMORY_LIMIT, Receiver
from collector.live.vllm_kv_subscriber import VllmKvEventSubscriber
from collector.store.live_copy import LiveCopy
from collector.store.run_file import RunConfig, RunFile, RunStore
from engine_hooks import EventBuffer
from engine_hooks.config import CaptureConfig
from engine_hooks.endpoint import EndpointError
from engine_hooks.events import Pool
from engine_hooks.transport import Transport
from tests.support.engine import collector_process, stored_record_numbers, wait_for
from tests.support.ports import free_port
from tests.support.repo import REPO

CONFIG = {"block_size": 16, "num_blocks": 100, "hash_algo": "sha256", "vllm_version": "0"}


TOKEN = "a-shared-token-of-some-length"


def collect(
    *args: str, umask: int | None = None, cwd: Path = REPO, **environment: str
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "collector.cli", "collect", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), **environment},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=None if umask is None else lambda: os.umask(umask),  # noqa: PLW1509
    )


def refused(*args: str, cwd: Path = REPO, **environment: str) -> str:
    process = collect(*args, cwd=cwd, **environment)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 2, output
    assert "Traceback" not in output
    return output


def sent_to(endpoint: str, token: bytes | None = None) -> Transport:
    buffer = EventBuffer()
    buffer.offer([Pool(0, 1, None, 1, 2, 3)])
    return Transport(buffer, endpoint, engine_id="engine", config=CONFIG, token=token).start()


def test_the_socket_folder_is_made_private_whatever_the_umask(tmp_path: Path) -> None:
    folder = tmp_path / "sockets"
    process = collect(
        "--db", str(tmp_path / "run.duckdb"), "--endpoint", f"ipc://{folder}/c.ipc", umask=0
    )
    assert process.stdout is not None
    assert "listening" in process.stdout.readline()
    process.terminate()
    process.wait(timeout=60)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


@pytest.mark.parametrize("squat", ["another user's folder", "a folder open to all"])
def test_a_socket_folder_that_is_not_private_is_refused_on_both_sides(
    tmp_path: Path, squat: str
) -> None:
    folder = tmp_path / "sockets"
    folder.mkdir(mode=0o700)
    if squat == "another user's folder":
        os.chown(folder, 65534, 65534)  # the tests run as root, as CI does
        reason = "belongs to user 65534, not to you"
    else:
        folder.chmod(0o777)
        reason = "is open to other users (mode 777)"
    endpoint = f"ipc://{folder}/c.ipc"
    assert reason in refused("--db", str(tmp_path / "run.duckdb"), "--endpoint", endpoint)
    with pytest.raises(EndpointError, match=re.escape(reason)):
        sent_to(endpoint)
    assert not (tmp_path / "run.duckdb").exists()


def test_a_second_collector_or_a_taken_metrics_port_is_a_clear_error(tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path}/c.ipc"
    port = free_port()
    with collector_process(tmp_path / "first.duckdb", endpoint, "--metrics-port", str(port)):
        second = refused("--db", str(tmp_path / "second.duckdb"), "--endpoint", endpoint)
        assert "another collector is listening there" in second
        tcp = refused(
            "--db",
            str(tmp_path / "third.duckdb"),
            "--endpoint",
            f"tcp://127.0.0.1:{port}",
            KVSCOPE_TOKEN=TOKEN,
        )
        assert "another process is listening there" in tcp
        metrics = refused(
            "--db",
            str(tmp_path / "fourth.duckdb"),
            "--endpoint",
            f"ipc://{tmp_path}/other.ipc",
            "--metrics-port",
            str(port),
        )
        assert f"--metrics-port {port}" in metrics
        assert list(tmp_path.glob("*.duckdb")) == []  # none got a batch, none wrote a file
        # A crashed run named again with the taken port stays as it was: resumable.
        crashed = tmp_path / "crashed.duckdb"
        RunStore.create(crashed, RunConfig("engine", 16, 100, "sha256", "0.33.0")).close()
        metrics = refused(
            "--db", str(crashed), "--endpoint", f"ipc://{tmp_path}/other.ipc",
            "--metrics-port", str(port),
        )  # fmt: skip
        assert f"--metrics-port {port}" in metrics
        with RunFile.open(crashed) as run:
            assert not run.finished


def test_threads_below_one_are_a_clear_error(tmp_path: Path) -> None:
    output = refused("--db", str(tmp_path / "run.duckdb"), "--threads", "0")
    assert "--threads 0: must be 1 or more" in output
    assert not (tmp_path / "run.duckdb").exists()


def test_a_memory_limit_that_is_no_amount_is_a_clear_error(tmp_path: Path) -> None:
    output = refused("--db", str(tmp_path / "run.duckdb"), "--memory-limit", "lots")
    assert "--memory-limit lots: give an amount such as 6GB or 512MB" in output
    assert not (tmp_path / "run.duckdb").exists()


def test_the_collectors_duckdb_keeps_to_its_memory_limit(tmp_path: Path) -> None:
    limits = {}
    for number, limit in enumerate((INGEST_MEMORY_LIMIT, "512MB")):
        run = tmp_path / f"resumed-{number}.duckdb"  # a collector killed: resumed below
        RunStore.create(run, RunConfig("engine", 16, 100, "sha256", "0.33.0")).close()
        receiver = Receiver(run, f"ipc://{tmp_path}/collector.ipc", memory_limit=limit)
        assert receiver.store is not None
        (limits[limit],) = receiver.store.row("SELECT current_setting('memory_limit')") or ("",)
        receiver.close()
    assert limits == {INGEST_MEMORY_LIMIT: "5.5 GiB", "512MB": "488.2 MiB"}


def test_a_failure_while_closing_still_finalizes_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "resumed.duckdb"  # a collector killed: resumed below
    RunStore.create(run, RunConfig("engine", 16, 100, "sha256", "0.33.0")).close()
    receiver = Receiver(run, f"ipc://{tmp_path}/collector.ipc")

    def failing(_: LiveCopy) -> None:
        raise RuntimeError("the live copy would not stop")

    monkeypatch.setattr(LiveCopy, "close", failing)
    with pytest.raises(RuntimeError, match="would not stop"):
        receiver.close()
    assert receiver.store is None
    with RunFile.open(run) as closed:
        assert closed.finished


def test_other_machines_need_allow_remote_and_a_token(tmp_path: Path) -> None:
    run = str(tmp_path / "run.duckdb")
    port = free_port()
    wildcard = refused("--db", run, "--endpoint", f"tcp://*:{port}")
    assert "other machines could reach this address" in wildcard
    no_token = refused("--db", run, "--endpoint", f"tcp://0.0.0.0:{port}", "--allow-remote")
    assert "--allow-remote needs KVSCOPE_TOKEN" in no_token
    short = refused("--db", run, "--endpoint", f"tcp://127.0.0.1:{port}", KVSCOPE_TOKEN="short")
    assert "KVSCOPE_TOKEN must be at least 16 characters" in short


def test_with_a_token_only_engines_that_present_it_are_heard(tmp_path: Path) -> None:
    token = TOKEN
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    process = collect(
        "--db", str(tmp_path / "run.duckdb"), "--endpoint", endpoint, KVSCOPE_TOKEN=token
    )
    assert process.stdout is not None
    assert "listening" in process.stdout.readline()
    intruder = sent_to(endpoint, b"not-the-token-at-all")
    engine = sent_to(endpoint, token.encode())
    wait_for(lambda: engine.num_delivered == 1)
    time.sleep(1)
    assert intruder.num_delivered == 0
    intruder.stop(flush_timeout_s=0)
    engine.stop()
    process.terminate()
    output, _ = process.communicate(timeout=60)
    assert "1 records in 1 batches" in output


def test_idle_exit_counts_from_the_first_batch(tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path}/c.ipc"
    process = collect(
        "--db", str(tmp_path / "run.duckdb"), "--endpoint", endpoint, "--idle-exit", "1"
    )
    assert process.stdout is not None
    assert "listening" in process.stdout.readline()
    time.sleep(3)  # a slow engine: the collector waits for it
    assert process.poll() is None
    engine = sent_to(endpoint)
    wait_for(lambda: engine.num_delivered == 1)
    engine.stop()
    assert process.wait(timeout=60) == 0


def test_nothing_listens_on_a_stale_socket_file(tmp_path: Path) -> None:
    """A socket file left by a collector that was killed does not block the next one."""
    path = tmp_path / "c.ipc"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
        stale.bind(str(path))
    with collector_process(tmp_path / "run.duckdb", f"ipc://{path}"):
        pass


def test_records_missing_at_the_end_of_a_stream_are_recorded(tmp_path: Path) -> None:
    """No later record shows a gap at a stream's end: the closing batch says where it ends."""
    endpoint, run = f"ipc://{tmp_path}/c.ipc", tmp_path / "run.duckdb"
    buffer = EventBuffer()
    buffer.offer([Pool(seq, 1_000 + seq, None, 1, 2, 3) for seq in range(5)])
    # The engine numbered 10 records; 5 to 9 never reached its buffer (refused when full).
    transport = Transport(buffer, endpoint, engine_id="engine", config=CONFIG, next_seq=lambda: 10)
    with collector_process(run, endpoint) as process:
        transport.start()
        wait_for(lambda: transport.num_delivered == 5)
        transport.stop()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    assert stored_record_numbers(run) == [0, 1, 2, 3, 4]
    with RunFile.open(run) as run_file:
        drops = run_file.rows("SELECT seq, ts_ns, num_lost FROM events WHERE kind = 'drop'")
    assert drops == [(5, 1_004, 5)]  # dated at the last record that arrived


def test_tcp_without_a_token_is_refused_on_both_sides(tmp_path: Path) -> None:
    """Any user of the machine can connect to a loopback port: the collector listens on TCP
    only with a token, and an engine set to send there without one says so."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    output = refused("--db", str(tmp_path / "run.duckdb"), "--endpoint", endpoint)
    assert "any user of this machine can connect to a TCP port; set KVSCOPE_TOKEN" in output
    assert not (tmp_path / "run.duckdb").exists()
    environment = {"KVSCOPE_CAPTURE": "1", "KVSCOPE_ENDPOINT": endpoint}
    with pytest.raises(ValueError, match="a collector listens on TCP only with KVSCOPE_TOKEN"):
        CaptureConfig.from_environment(environment)
    with pytest.raises(ValueError, match="KVSCOPE_TOKEN must be at least 16 characters"):
        CaptureConfig.from_environment({**environment, "KVSCOPE_TOKEN": "short"})
    assert CaptureConfig.from_environment({**environment, "KVSCOPE_TOKEN": TOKEN}).enabled


@pytest.mark.parametrize("port", ["0", "*", "00", "65536", "http"])
def test_a_port_no_engine_can_know_is_refused_on_both_sides(tmp_path: Path, port: str) -> None:
    endpoint = f"tcp://127.0.0.1:{port}"
    output = refused("--db", str(tmp_path / "run.duckdb"), "--endpoint", endpoint)
    reason = "lets the system pick a port" if port in ("0", "*", "00") else "1 to 65535"
    assert f"{endpoint}: " in output and reason in output
    with pytest.raises(EndpointError, match=re.escape(reason)):
        sent_to(endpoint, TOKEN.encode())
    with pytest.raises(EndpointError, match=re.escape(reason)):
        VllmKvEventSubscriber(endpoint)
    output = refused(
        "--db", str(tmp_path / "run.duckdb"), "--endpoint", f"ipc://{tmp_path}/c.ipc",
        "--vllm-kv-events", endpoint,
    )  # fmt: skip
    assert reason in output
    assert not (tmp_path / "run.duckdb").exists()


def test_an_abstract_socket_is_refused_on_both_sides_unless_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ipc://@NAME` has no folder: any user could connect to it and send records, or bind it
    first and receive an engine's. Run from a private folder, the check of the socket's
    folder once passed it (it looked at the working folder)."""
    endpoint = f"ipc://@kvscope-test-{os.getpid()}"
    run = tmp_path / "run.duckdb"
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o700
    output = refused("--db", str(run), "--endpoint", endpoint, cwd=tmp_path)
    assert f"{endpoint}: an abstract socket has no folder and no permissions" in output
    assert "KVSCOPE_ALLOW_ABSTRACT_SOCKET=1" in output
    with pytest.raises(EndpointError, match="an abstract socket"):
        sent_to(endpoint)
    with pytest.raises(EndpointError, match="an abstract socket"):
        VllmKvEventSubscriber(endpoint)
    output = refused(
        "--db", str(run), "--endpoint", f"ipc://{tmp_path}/c.ipc", "--vllm-kv-events", endpoint
    )
    assert "an abstract socket" in output
    assert not run.exists()

    # Allowed on both sides: it works, and the collector says who else can connect.
    process = collect(
        "--db", str(run), "--endpoint", endpoint, cwd=tmp_path, KVSCOPE_ALLOW_ABSTRACT_SOCKET="1"
    )
    assert process.stdout is not None
    warning = process.stdout.readline()
    assert "is an abstract socket: any user of this machine can connect to it" in warning
    assert "listening" in process.stdout.readline()
    monkeypatch.setenv("KVSCOPE_ALLOW_ABSTRACT_SOCKET", "1")
    engine = sent_to(endpoint)
    wait_for(lambda: engine.num_delivered == 1)
    engine.stop()
    process.terminate()
    output, _ = process.communicate(timeout=60)
    assert "1 records in 1 batches" in output
