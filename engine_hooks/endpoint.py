"""Where an engine and `kvscope collect` meet: private to one user by default.

An `ipc://PATH` socket sits in a folder that only its owner can use: made with mode 0700 when
missing, refused when another user owns it or others may write to it (someone could then
put their own socket in its place and receive the records), and refused when the socket
file itself belongs to another user. A TCP endpoint must be on the loopback network unless
the collector is told `--allow-remote`, and then engines must present `KVSCOPE_TOKEN`
(ZMQ's PLAIN mechanism: the token authenticates, it does not encrypt).
"""

from __future__ import annotations

import ipaddress
import os
import stat
from pathlib import Path

TOKEN_ENV = "KVSCOPE_TOKEN"
TOKEN_USER = b"kvscope"
MIN_TOKEN_LENGTH = 16


class EndpointError(ValueError):
    """An endpoint kvscope will not use; the message says which and why."""


def default_endpoint() -> str:
    """A per-user IPC socket in a per-user folder: local-only by construction."""
    return f"ipc:///tmp/kvscope-{os.getuid()}/collect.ipc"


def ipc_path(endpoint: str) -> Path | None:
    return Path(endpoint.removeprefix("ipc://")) if endpoint.startswith("ipc://") else None


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


def make_private_socket_folder(endpoint: str) -> None:
    """For `ipc://PATH`: make PATH's folder (0700) if missing; refuse one that is not private."""
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
