"""The app listens on 127.0.0.1 only, from any working folder: `streamlit run` of the app's
path (its settings sit beside the script, where Streamlit reads them) and `kvscope app`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tests.support.repo import REPO, SAMPLE_RUN

APP = REPO / "visualizer" / "app.py"


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


def serving_addresses(command: list[str], folder: Path, port: int) -> set[str]:
    process = subprocess.Popen(
        command,
        cwd=folder,
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
        return listening_addresses(port)
    finally:
        process.terminate()
        process.wait(timeout=60)


@pytest.mark.parametrize("how", ["streamlit run", "kvscope app"])
def test_the_app_listens_on_loopback_only_from_any_folder(tmp_path: Path, how: str) -> None:
    port = free_port()
    if how == "streamlit run":
        command = [sys.executable, "-m", "streamlit", "run", str(APP), "--server.port", str(port)]
    else:
        command = [sys.executable, "-m", "collector.cli", "app", "--port", str(port)]
        command += ["--db", str(SAMPLE_RUN)]
    assert serving_addresses(command, tmp_path, port) == {"0100007F"}  # 127.0.0.1 alone


def test_the_apps_settings_send_no_usage_statistics() -> None:
    settings = tomllib.loads((APP.parent / ".streamlit" / "config.toml").read_text())
    assert settings["server"]["address"] == "127.0.0.1"
    assert settings["browser"]["gatherUsageStats"] is False
