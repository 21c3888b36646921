"""Capture settings, read from the environment of the vLLM process (docs/live-capture.md,
"Settings")."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from engine_hooks.endpoint import MIN_TOKEN_LENGTH, TOKEN_ENV, default_endpoint

# The fingerprints (the collision check's and the key-free ones that tell a key mismatch, one
# XXH3 pass: fingerprint.py) cost the hooks about a tenth of the block manager's time
# (docs/benchmarks.md), so they are on for every hash vLLM offers. The collision check finds
# something in practice only with xxHash (`--prefix-caching-hash-algo xxhash` or
# `xxhash_cbor`: 128 bits, but not built against crafted inputs); SHA-256, vLLM's default, is
# cryptographic. The key-free fingerprints serve every hash.


def checks_collisions(setting: bool | None) -> bool:
    """Whether to fingerprint blocks (the collision check and the key-free fingerprints): as
    set, or (None: auto) always."""
    return setting is not False


def _flag(environment: Mapping[str, str], name: str, default: bool | None) -> bool | None:
    value = environment.get(name)
    if value is None or value == "" or (default is None and value.lower() == "auto"):
        return default
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    auto = " (or auto)" if default is None else ""
    raise ValueError(f"{name}={value!r}: expected 1/0, true/false, yes/no or on/off{auto}")


@dataclass(frozen=True)
class CaptureConfig:
    """What the plugin does inside the engine; `enabled` False means nothing at all."""

    enabled: bool = False
    endpoint: str = ""
    engine_id: str = ""
    check_collisions: bool | None = None  # None: auto (checks_collisions)
    record_token_ids: bool = False
    reveal_tenants: bool = False
    tenant_from_salt: bool = False
    buffer_capacity: int = 500_000
    max_in_flight: int = 256
    max_backlog_mb: float = 256
    flush_timeout_s: float = 5.0

    @classmethod
    def from_environment(cls, environment: Mapping[str, str] | None = None) -> CaptureConfig:
        """KVSCOPE_CAPTURE=1 switches capture on; the other KVSCOPE_* variables tune it."""
        env = os.environ if environment is None else environment
        endpoint = env.get("KVSCOPE_ENDPOINT") or default_endpoint()
        if not endpoint.startswith(("ipc://", "tcp://")):
            raise ValueError(
                f"KVSCOPE_ENDPOINT={endpoint!r}: expected ipc://PATH or tcp://HOST:PORT"
            )
        token = env.get(TOKEN_ENV, "")
        if endpoint.startswith("tcp://") and not token:
            raise ValueError(
                f"KVSCOPE_ENDPOINT={endpoint!r}: a collector listens on TCP only with "
                f"{TOKEN_ENV} set; set the same {TOKEN_ENV} here, or use ipc://PATH"
            )
        if token and len(token) < MIN_TOKEN_LENGTH:
            raise ValueError(f"{TOKEN_ENV} must be at least {MIN_TOKEN_LENGTH} characters")
        tenant_from = env.get("KVSCOPE_TENANT_FROM", "extra_args")
        if tenant_from not in ("extra_args", "salt"):
            raise ValueError(f"KVSCOPE_TENANT_FROM={tenant_from!r}: expected extra_args or salt")
        return cls(
            enabled=bool(_flag(env, "KVSCOPE_CAPTURE", False)),
            endpoint=endpoint,
            engine_id=env.get("KVSCOPE_ENGINE_ID") or f"{socket.gethostname()}:{os.getpid()}",
            check_collisions=_flag(env, "KVSCOPE_CHECK_COLLISIONS", None),
            record_token_ids=bool(_flag(env, "KVSCOPE_RECORD_TOKEN_IDS", False)),
            reveal_tenants=bool(_flag(env, "KVSCOPE_REVEAL_TENANTS", False)),
            tenant_from_salt=tenant_from == "salt",
            buffer_capacity=int(env.get("KVSCOPE_BUFFER_CAPACITY", "500000")),
            max_in_flight=int(env.get("KVSCOPE_MAX_IN_FLIGHT", "256")),
            max_backlog_mb=float(env.get("KVSCOPE_MAX_BACKLOG_MB", "256")),
            flush_timeout_s=float(env.get("KVSCOPE_FLUSH_TIMEOUT_S", "5")),
        )
