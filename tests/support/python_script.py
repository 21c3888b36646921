"""A Python script run by a fresh interpreter in the repository: for what must not happen in
the test's own process (modules hidden, memory capped, a contract broken)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from tests.support.repo import REPO


def run_python(
    script: str, *args: str, check: bool, **options: Any
) -> subprocess.CompletedProcess[str]:
    """`script` with `args` as its sys.argv[1:], run by this Python in the repository, its
    output captured as text; `options` (timeout, env) go to `subprocess.run`."""
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=check,
        **options,
    )
