"""Keyed pseudonyms for tenant names and cache salts: labels leave the engine, names don't."""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
from pathlib import Path

SECRET_ENV = "KVSCOPE_SECRET"
SECRET_FILE = Path.home() / ".config" / "kvscope" / "secret"


def load_secret() -> bytes:
    """Return this machine's pseudonym key: $KVSCOPE_SECRET, else a 0600 file made once."""
    from_env = os.environ.get(SECRET_ENV)
    if from_env:
        return from_env.encode()
    try:
        return SECRET_FILE.read_bytes()
    except FileNotFoundError:
        return _create_secret()


def _create_secret() -> bytes:
    """Write a new key beside the file, then link it into place: of processes starting at
    once, the first link wins and the others read the winner's key, never a partial one."""
    SECRET_FILE.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    secret = os.urandom(32).hex().encode()
    temporary = SECRET_FILE.with_name(f".{SECRET_FILE.name}-{os.getpid()}-{threading.get_ident()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(secret)
    try:
        os.link(temporary, SECRET_FILE)
    except FileExistsError:
        secret = SECRET_FILE.read_bytes()
    finally:
        temporary.unlink()
    return secret


class Pseudonymizer:
    """Turns private strings into stable keyed labels (HMAC-SHA256, truncated)."""

    def __init__(self, secret: bytes, reveal_tenants: bool = False) -> None:
        self._secret = secret
        self.reveal_tenants = reveal_tenants
        self._loras: dict[str, str] = {}  # one HMAC per adapter, not one per request

    def key(self, purpose: str, size: int) -> bytes:
        """`size` bytes (at most 32) of key for `purpose`, derived from the secret: the same
        on every engine and replay that shares it."""
        return hmac.new(self._secret, f"key\x00{purpose}".encode(), hashlib.sha256).digest()[:size]

    def _digest(self, domain: str, value: str) -> str:
        message = f"{domain}\x00{value}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()[:12]

    def tenant(self, name: str | None) -> str | None:
        """The tenant as stored: the name if the user opted in, else `tenant-<hmac>`."""
        if name is None:
            return None
        return name if self.reveal_tenants else f"tenant-{self._digest('tenant', name)}"

    def lora(self, name: str | None) -> str | None:
        """The LoRA adapter as stored: its name if the user opted in (adapter names often
        name a customer), else `lora-<hmac>`, the same for the same name."""
        if name is None or self.reveal_tenants:
            return name
        label = self._loras.get(name)
        if label is None:
            label = self._loras[name] = f"lora-{self._digest('lora', name)}"
        return label

    def salt(self, salt: str | None) -> str | None:
        """A keyed hash of a cache salt; the salt itself is never stored."""
        if not salt:
            return None
        return f"salt-{self._digest('salt', salt)}"
