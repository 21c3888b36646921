"""What the doctor checks of this process's environment (doctor_checks.py): whether vLLM
will load kvscope's plugin, its KVSCOPE_* settings, and the collector's endpoint: whether the
socket's folder is private (checked, not made) and whether a collector listens there now."""

from __future__ import annotations

import importlib.metadata
import os
import socket
import stat
from collections.abc import Mapping
from typing import Any

from collector.commands.doctor_check import FAIL, OK, WARN, Check
from engine_hooks.config import CaptureConfig
from engine_hooks.endpoint import (
    ALLOW_ABSTRACT_ENV,
    EndpointError,
    check_endpoint,
    default_endpoint,
    ipc_path,
    is_abstract,
    is_loopback,
    make_private_socket_folder,
    tcp_host,
)

PLUGIN_GROUP = "vllm.general_plugins"
PLUGIN_NAME = "kvscope"
PROBE_TIMEOUT_S = 1.0  # connecting to the collector's endpoint


def plugin_checks(env: Mapping[str, str]) -> list[Check]:
    """Whether vLLM will load kvscope's plugin here: its entry point, and VLLM_PLUGINS."""
    entry = next(
        (
            point
            for point in importlib.metadata.entry_points(group=PLUGIN_GROUP)
            if point.name == PLUGIN_NAME
        ),
        None,
    )
    if entry is None:
        checks = [
            Check(
                FAIL,
                "plugin",
                f"no entry point `{PLUGIN_GROUP}: {PLUGIN_NAME}` in this environment: vLLM "
                "will not load kvscope",
                "install kvscope into the environment vLLM runs in (`pip install kvscope`)",
            )
        ]
    else:
        try:
            entry.load()
        except Exception as error:
            checks = [
                Check(
                    FAIL,
                    "plugin",
                    f"the entry point {entry.value} cannot be loaded: {type(error).__name__}: "
                    f"{error}",
                    "reinstall kvscope in this environment",
                )
            ]
        else:
            owner = f" ({entry.dist.name} {entry.dist.version})" if entry.dist else ""
            checks = [
                Check(
                    OK,
                    "plugin",
                    f"entry point `{PLUGIN_GROUP}: {PLUGIN_NAME} = {entry.value}`{owner}: "
                    "vLLM loads it in every process it starts",
                )
            ]
    allowed = env.get("VLLM_PLUGINS")
    if allowed is not None and PLUGIN_NAME not in allowed.split(","):
        checks.append(
            Check(
                FAIL,
                "VLLM_PLUGINS",
                f"VLLM_PLUGINS={allowed!r} leaves kvscope out: vLLM loads only the plugins it "
                "names",
                "add kvscope to VLLM_PLUGINS (comma-separated), or unset it",
            )
        )
    return checks


def settings_checks(env: Mapping[str, str]) -> list[Check]:
    """The KVSCOPE_* settings as the plugin reads them, the endpoint, and the collector."""
    named = sorted(name for name in env if name.startswith("KVSCOPE_"))
    try:
        config = CaptureConfig.from_environment(env)
    except ValueError as error:
        return [
            Check(
                FAIL,
                "settings",
                f"the plugin refuses these settings: {error}",
                "fix that variable, or unset it for its default",
            ),
            *_endpoint_checks(env),
        ]
    listed = ", ".join(named) if named else "none set: the defaults"
    checks = [Check(OK, "settings", f"the KVSCOPE_* variables are valid ({listed})")]
    if config.enabled:
        checks.append(
            Check(OK, "switch", "KVSCOPE_CAPTURE is on: the plugin attaches to every engine")
        )
    else:
        checks.append(
            Check(
                WARN,
                "switch",
                "KVSCOPE_CAPTURE is off here: an engine started from this environment runs "
                "uncaptured",
                "set KVSCOPE_CAPTURE=1 in the environment that starts vLLM",
            )
        )
    return checks + _endpoint_checks(env)


def _endpoint_checks(env: Mapping[str, str]) -> list[Check]:
    """Where engines send and the collector listens; whether the socket's folder is private;
    whether a collector listens there now."""
    endpoint = env.get("KVSCOPE_ENDPOINT") or default_endpoint()
    origin = "KVSCOPE_ENDPOINT" if env.get("KVSCOPE_ENDPOINT") else "the default"
    allow_abstract = env.get(ALLOW_ABSTRACT_ENV, "").lower() in ("1", "true", "yes", "on")
    fix_endpoint = "set KVSCOPE_ENDPOINT to ipc://PATH in a folder only you use (or unset it)"
    try:
        check_endpoint(endpoint, allow_abstract)
        path = ipc_path(endpoint)
        if path is not None and path.parent.exists():
            make_private_socket_folder(endpoint, allow_abstract)  # checks; makes nothing here
    except EndpointError as error:
        return [Check(FAIL, "endpoint", str(error), fix_endpoint)]
    if path is not None:
        if path.parent.exists():
            mode = stat.S_IMODE(path.parent.stat().st_mode)
            where = f"its folder {path.parent} is yours alone (mode {mode:o})"
        elif os.access(path.parent.parent, os.W_OK):
            where = f"`kvscope collect` makes its folder {path.parent} (mode 700)"
        else:
            return [
                Check(
                    FAIL,
                    "endpoint",
                    f"{endpoint}: the folder {path.parent} is missing and cannot be made in "
                    f"{path.parent.parent}",
                    fix_endpoint,
                )
            ]
        checks = [Check(OK, "endpoint", f"{endpoint} ({origin}): {where}")]
    else:
        host = tcp_host(endpoint)
        if host is not None and not is_loopback(host):
            checks = [
                Check(
                    WARN,
                    "endpoint",
                    f"{endpoint} ({origin}) is reachable from other machines: the collector "
                    "needs --allow-remote, and the token authenticates engines but encrypts "
                    "nothing",
                    "use ipc://PATH or tcp://127.0.0.1:PORT unless engines run elsewhere",
                )
            ]
        else:
            checks = [Check(OK, "endpoint", f"{endpoint} ({origin})")]
    checks.append(_collector_check(endpoint, origin == "the default"))
    return checks


def _collector_check(endpoint: str, default: bool) -> Check:
    """Whether something accepts connections at the endpoint now (nothing is sent)."""
    path = ipc_path(endpoint)
    start = "`kvscope collect --db RUN.duckdb" + ("`" if default else f" --endpoint {endpoint}`")
    if path is not None or is_abstract(endpoint):
        address: Any = "\0" + endpoint.removeprefix("ipc://@") if path is None else str(path)
        family = socket.AF_UNIX
    else:
        host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
        address = (host.removeprefix("[").removesuffix("]"), int(port))
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.settimeout(PROBE_TIMEOUT_S)
            probe.connect(address)
    except OSError:
        return Check(
            WARN,
            "collector",
            f"nothing listens at {endpoint} yet: engines hold their first batches until a "
            "collector comes (KVSCOPE_MAX_IN_FLIGHT), then drop",
            f"start {start} before or beside vLLM",
        )
    return Check(OK, "collector", f"a collector listens at {endpoint}")
