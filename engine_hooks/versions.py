"""The vLLM versions kvscope supports: each is tested in CI (README.md, "vLLM versions")."""

from __future__ import annotations

SUPPORTED_VLLM = ("0.32.", "0.33.")


def is_supported(version: str) -> bool:
    return version.startswith(SUPPORTED_VLLM)


def supported_versions() -> str:
    """The supported versions as a reader would write them: "0.32.x, 0.33.x"."""
    return ", ".join(f"{prefix}x" for prefix in SUPPORTED_VLLM)
