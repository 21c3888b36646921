"""Where an engine and `kvscope collect` meet: private to one user by default.

An `ipc://PATH` socket sits in a folder that only its owner can use: made with mode 0700 when
missing, refused when another user owns it or others may write to it (someone could then
put their own socket in its place and receive the records), and refused when the socket
file itself belongs to another user. An abstract socket (`ipc://@NAME`) has no folder and no
permissions, so anyone on the host can connect to it, or take its name first: refused on
both sides unless KVSCOPE_ALLOW_ABSTRACT_SOCKET=1, and then with a warning.

Any user of the machine can connect to a TCP port, the loopback's too, so the collector
listens on TCP only with `KVSCOPE_TOKEN` set, and engines must present it (ZMQ's PLAIN
mechanism: the token authenticates the engine, it does not encrypt, and it does not tell an
engine which process listens). Other machines are refused unless the collector is told
`--allow-remote`. Port 0 (or `*`) would be a port the system picks, which no engine can know:
refused.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import stat
from pathlib import Path

TOKEN_ENV = "KVSCOPE_TOKEN"
TOKEN_USER = b"kvscope"
MIN_TOKEN_LENGTH = 16
ALLOW_ABSTRACT_ENV = "KVSCOPE_ALLOW_ABSTRACT_SOCKET"
_PORT = re.compile(r"[0-9]{1,5}")

logger = logging.getLogger("vllm.kvscope")  # vLLM's own handlers print it in an engine


class EndpointError(ValueError):
    """An endpoint kvscope will not use; the message says which and why."""


def default_endpoint() -> str:
    """A per-user IPC socket in a per-user folder: local-only by construction."""
    return f"ipc:///tmp/kvscope-{os.getuid()}/collect.ipc"


def is_abstract(endpoint: str) -> bool:
    """Whether `endpoint` names a socket in Linux's abstract namespace (`ipc://@NAME`)."""
    return endpoint.startswith("ipc://@")


def ipc_path(endpoint: str) -> Path | None:
    """The socket file of `ipc://PATH` (None for other endpoints, abstract ones too)."""
    if not endpoint.startswith("ipc://") or is_abstract(endpoint):
        return None
    return Path(endpoint.removeprefix("ipc://"))


def abstract_sockets_allowed() -> bool:
    """Whether KVSCOPE_ALLOW_ABSTRACT_SOCKET says yes (1, true, yes, on)."""
    return os.environ.get(ALLOW_ABSTRACT_ENV, "").lower() in ("1", "true", "yes", "on")


def check_endpoint(endpoint: str, allow_abstract: bool | None = None) -> None:
    """Refuse what neither side uses: a form other than ipc://PATH or tcp://HOST:PORT, an
    abstract socket unless allowed (`allow_abstract`, else KVSCOPE_ALLOW_ABSTRACT_SOCKET;
    allowed, it is used with a warning), a port other than 1 to 65535."""
    if is_abstract(endpoint):
        allowed = abstract_sockets_allowed() if allow_abstract is None else allow_abstract
        if not allowed:
            raise EndpointError(
                f"{endpoint}: an abstract socket has no folder and no permissions: any user "
                "of this machine could connect to it, send records, or take its name first "
                f"and receive them; use ipc://PATH in a folder of your own (or set "
                f"{ALLOW_ABSTRACT_ENV}=1 on both sides to accept that)"
            )
        logger.warning(
            "kvscope: %s is an abstract socket: any user of this machine can connect to it (%s=1)",
            endpoint,
            ALLOW_ABSTRACT_ENV,
        )
        return
    if endpoint.startswith("ipc://") and len(endpoint) > len("ipc://"):
        return
    if not endpoint.startswith("tcp://"):
        raise EndpointError(f"{endpoint}: expected ipc://PATH or tcp://HOST:PORT")
    host, colon, port = endpoint.removeprefix("tcp://").rpartition(":")
    if not colon or not host:
        raise EndpointError(f"{endpoint}: expected tcp://HOST:PORT")
    if port == "*" or (_PORT.fullmatch(port) and int(port) == 0):
        raise EndpointError(
            f"{endpoint}: port {port} lets the system pick a port, which no engine can know; "
            "give a port from 1 to 65535"
        )
    if not _PORT.fullmatch(port) or int(port) > 65_535:
        raise EndpointError(f"{endpoint}: the port must be a number from 1 to 65535")


def tcp_host(endpoint: str) -> str | None:
    if not endpoint.startswith("tcp://"):
        return None
    host = endpoint.removeprefix("tcp://").rsplit(":", 1)[0]
    return host.removeprefix("[").removesuffix("]")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name or a wildcard (`*`): other machines may reach it


def make_private_socket_folder(endpoint: str, allow_abstract: bool | None = None) -> None:
    """Check `endpoint` (`check_endpoint`); for `ipc://PATH`, make PATH's folder (0700) if
    missing, and refuse one that is not private."""
    check_endpoint(endpoint, allow_abstract)
    path = ipc_path(endpoint)
    if path is None:
        return
    folder = path.parent
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as error:
        raise EndpointError(f"{endpoint}: cannot make the folder {folder}: {error}") from None
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise EndpointError(f"{endpoint}: {folder} is not a folder (a link, or a file)")
    if info.st_uid != os.getuid():
        raise EndpointError(
            f"{endpoint}: {folder} belongs to user {info.st_uid}, not to you: another user "
            "could receive your records there; use a folder of your own"
        )
    if info.st_mode & 0o077:
        raise EndpointError(
            f"{endpoint}: {folder} is open to other users (mode {stat.S_IMODE(info.st_mode):o}); "
            f"kvscope's socket needs a folder only you can use (chmod 700 {folder})"
        )
    try:
        owner = path.lstat().st_uid
    except FileNotFoundError:
        return
    if owner != os.getuid():
        raise EndpointError(f"{endpoint}: the socket belongs to user {owner}, not to you")


def engine_token() -> bytes | None:
    """The shared token engines present to a collector that asks for one."""
    token = os.environ.get(TOKEN_ENV)
    return token.encode() if token else None
