"""The app is served on 127.0.0.1 without usage statistics from any working folder
(`kvscope app`), and a Streamlit server started otherwise shows no run at all."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.conftest import REPO, SAMPLE_RUN
from tests.vllm_server import free_port

APP_TEST = f"""
from streamlit.testing.v1 import AppTest
app = AppTest.from_file({str(REPO / "visualizer" / "app.py")!r}, default_timeout=120)
app.session_state["run_path"] = {str(SAMPLE_RUN)!r}
app.run()
assert not app.exception, app.exception
print("metrics:", len(app.metric))
print("errors:", " ".join(error.value for error in app.error))
"""


def app_in(folder: Path) -> str:
    """The overview as AppTest renders it with `folder` as the working folder (every other
    app test runs from the checkout, where it shows the run)."""
    result = subprocess.run(
        [sys.executable, "-c", APP_TEST],
        cwd=folder,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return result.stdout


def test_started_outside_the_checkout_the_app_shows_no_run(tmp_path: Path) -> None:
    output = app_in(tmp_path)
    assert "metrics: 0" in output
    assert "listens on every network interface or sends usage statistics" in output
    assert "kvscope app" in output


def listening_addresses(port: int) -> set[str]:
    """The local addresses of sockets listening on `port` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


def test_kvscope_app_listens_on_loopback_only_from_any_folder(tmp_path: Path) -> None:
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "collector.cli",
            "app",
            "--port",
            str(port),
            "--db",
            str(SAMPLE_RUN),
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=5):
                    break
            except OSError:
                assert time.monotonic() < deadline and process.poll() is None, "no app"
                time.sleep(0.5)
        assert listening_addresses(port) == {"0100007F"}  # 127.0.0.1, and nothing else
    finally:
        process.terminate()
        process.wait(timeout=60)
