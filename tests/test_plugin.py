"""The plugin does nothing at all when capture is off, and on a vLLM version it does not
support it logs one clear line and leaves the engine as it is."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from engine_hooks.config import CaptureConfig, checks_collisions
from tests.support.repo import REPO

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version

PROBE = """
import vllm
{version_override}
from engine_hooks.plugin import register
from vllm.v1.core.sched.scheduler import Scheduler
original = Scheduler.__init__
register()
print("patched" if Scheduler.__init__ is not original else "untouched")
"""


def run_probe(environment: dict[str, str], version_override: str = "") -> tuple[str, list[str]]:
    """What happened to the Scheduler, and kvscope's log lines (vLLM logs to stdout)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("KVSCOPE_")}
    env.update(environment, PYTHONPATH=str(REPO))
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(version_override=version_override)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        cwd=REPO,
    )
    lines = (result.stdout + result.stderr).splitlines()
    return result.stdout.splitlines()[-1], [line for line in lines if "kvscope" in line]


def test_capture_off_changes_nothing() -> None:
    assert run_probe({}) == ("untouched", [])


def test_capture_on_patches_the_scheduler() -> None:
    assert run_probe({"KVSCOPE_CAPTURE": "1"})[0] == "patched"


def test_unsupported_vllm_version_is_one_clear_log_line() -> None:
    outcome, lines = run_probe({"KVSCOPE_CAPTURE": "1"}, 'vllm.__version__ = "0.40.0"')
    assert outcome == "untouched"
    assert len(lines) == 1
    assert (
        "capture disabled: vLLM 0.40.0 is not supported (kvscope supports 0.32.x, 0.33.x, "
        "0.34.x)" in lines[0]
    )


def test_a_bad_setting_is_one_clear_log_line() -> None:
    outcome, lines = run_probe({"KVSCOPE_CAPTURE": "1", "KVSCOPE_ENDPOINT": "http://nope"})
    assert outcome == "untouched"
    assert len(lines) == 1
    assert "capture disabled: KVSCOPE_ENDPOINT='http://nope'" in lines[0]


SHUTDOWN_PROBE = """
from engine_hooks.plugin import register
register()
from vllm.v1.engine.utils import get_engine_process_shutdown_timeout as timeout
# vLLM's default (abort at once, no process grace), then a drain timeout the user set
print(timeout(0, 0), timeout(30, 12.5))
"""


def test_capture_gives_the_engine_core_time_to_flush_at_shutdown() -> None:
    def timeouts(environment: dict[str, str]) -> str:
        env = {key: value for key, value in os.environ.items() if not key.startswith("KVSCOPE_")}
        env.update(environment, PYTHONPATH=str(REPO))
        result = subprocess.run(
            [sys.executable, "-c", SHUTDOWN_PROBE],
            capture_output=True,
            text=True,
            env=env,
            check=True,
            cwd=REPO,
        )
        return result.stdout.splitlines()[-1]

    assert timeouts({}) == "0 12.5"  # capture off: vLLM's own behaviour
    on = {"KVSCOPE_CAPTURE": "1", "KVSCOPE_FLUSH_TIMEOUT_S": "3"}
    assert timeouts(on) == "8.0 12.5"  # the flush timeout + 5 s; a drain timeout untouched


def test_the_fingerprints_are_on_by_default_for_every_hash() -> None:
    """The collision check and the key-free fingerprints: on unless switched off."""

    def setting(value: str | None) -> bool | None:
        environment = {} if value is None else {"KVSCOPE_CHECK_COLLISIONS": value}
        return CaptureConfig.from_environment(environment).check_collisions

    assert setting(None) is None and setting("auto") is None
    assert checks_collisions(setting(None)) and checks_collisions(setting("auto"))
    assert checks_collisions(setting("1")) and not checks_collisions(setting("0"))
    with pytest.raises(ValueError, match=r"KVSCOPE_CHECK_COLLISIONS='maybe'.*or auto"):
        setting("maybe")
