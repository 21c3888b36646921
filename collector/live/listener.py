"""The collector's end of the engines' socket: bound only where it is private, or with a token.

See `engine_hooks.endpoint` for the rules. Binding reports every refusal as an
`EndpointError` naming the endpoint and the reason (another collector is already there,
the folder is not private, an abstract socket not allowed, TCP without a token, an address
that reaches other machines without --allow-remote, port 0).
"""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import zmq
from zmq.auth.thread import ThreadAuthenticator

from engine_hooks.endpoint import (
    MIN_TOKEN_LENGTH,
    TOKEN_ENV,
    TOKEN_USER,
    EndpointError,
    check_endpoint,
    ipc_path,
    is_loopback,
    make_private_socket_folder,
    tcp_host,
)
from engine_hooks.transport import MAX_FRAME_BYTES


class Listener:
    """A bound ROUTER socket (and its authenticator when engines must present a token)."""

    def __init__(
        self,
        endpoint: str,
        *,
        allow_remote: bool = False,
        token: bytes | None = None,
        allow_abstract: bool | None = None,
    ):
        _check(endpoint, allow_remote, token, allow_abstract)
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.socket: zmq.Socket[bytes] = context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)  # checked before decoding
        self._authenticator: ThreadAuthenticator | None = None
        if token is not None:
            self._authenticator = ThreadAuthenticator(context)
            self._authenticator.start()
            self._authenticator.configure_plain(
                domain="*", passwords={TOKEN_USER.decode(): token.decode()}
            )
            self.socket.plain_server = True
        try:
            self.socket.bind(endpoint)
        except zmq.ZMQError as error:
            self.close()
            in_use = error.errno == errno.EADDRINUSE
            reason = "another process is listening there" if in_use else str(error)
            raise EndpointError(f"{endpoint}: cannot listen: {reason}") from None

    def close(self) -> None:
        self.socket.close(linger=0)
        if self._authenticator is not None:
            self._authenticator.stop()
            self._authenticator = None


def _check(
    endpoint: str, allow_remote: bool, token: bytes | None, allow_abstract: bool | None
) -> None:
    if token is not None and len(token) < MIN_TOKEN_LENGTH:
        raise EndpointError(f"{TOKEN_ENV} must be at least {MIN_TOKEN_LENGTH} characters")
    check_endpoint(endpoint, allow_abstract)
    host = tcp_host(endpoint)
    if host is not None:
        if not is_loopback(host) and not allow_remote:
            raise EndpointError(
                f"{endpoint}: other machines could reach this address; listen on 127.0.0.1, "
                f"or pass --allow-remote with {TOKEN_ENV} set on the collector and the engines"
            )
        if token is None and not is_loopback(host):
            raise EndpointError(f"{endpoint}: --allow-remote needs {TOKEN_ENV} (a shared token)")
        if token is None:
            raise EndpointError(
                f"{endpoint}: any user of this machine can connect to a TCP port; set "
                f"{TOKEN_ENV} ({MIN_TOKEN_LENGTH} characters or more) for the collector and "
                "the engines, or use ipc://PATH (the default)"
            )
        return
    path = ipc_path(endpoint)
    if path is None:
        return  # an abstract socket, allowed (check_endpoint warned)
    make_private_socket_folder(endpoint, allow_abstract=False)
    if _listening(path):
        raise EndpointError(f"{endpoint}: another collector is listening there")


def _listening(path: Path) -> bool:
    """Whether a process accepts connections on the Unix socket at `path` (not a stale file)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True
