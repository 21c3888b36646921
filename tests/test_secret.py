"""The per-machine pseudonym key: made once, 0600, the same for processes that start at once."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from tests.support.repo import REPO

READ_KEY = "from engine_hooks.privacy import load_secret; print(load_secret().decode())"


def test_processes_starting_at_once_agree_on_one_key(tmp_path: Path) -> None:
    environment = {key: value for key, value in os.environ.items() if key != "KVSCOPE_SECRET"}
    environment.update(HOME=str(tmp_path), PYTHONPATH=str(REPO))
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", READ_KEY],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(12)
    ]
    results = [process.communicate(timeout=120) for process in processes]
    assert [process.returncode for process in processes] == [0] * 12, results
    keys = {stdout.strip() for stdout, _ in results}
    secret = tmp_path / ".config" / "kvscope" / "secret"
    assert keys == {secret.read_text()} and len(secret.read_text()) == 64
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(secret.parent.stat().st_mode) == 0o700
    assert [path.name for path in secret.parent.iterdir()] == ["secret"]
