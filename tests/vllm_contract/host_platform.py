"""A pytest plugin for vLLM's own test session on a machine without an accelerator (CI's):
vLLM's current platform is one whose device is the host CPU, and nothing else.

vLLM's tests build `VllmConfig` without a `DeviceConfig`, which asks the current platform for
its device; a CUDA build of vLLM on a machine without a GPU finds no platform ("Failed to
infer device type"), and vLLM's CPU platform requires triton-cpu on x86. This one is vLLM's
`UnspecifiedPlatform` with the device kvscope's replays give vLLM's scheduler
(`DeviceConfig(device="cpu")`): it changes no setting of the configs the tests build.
Loaded with `-p` in both runs of tests/test_vllm_contract.py, with and without kvscope's hooks.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)  # before anything imports vLLM's configs (hooks_everywhere)
def pytest_configure(config: pytest.Config) -> None:
    import vllm.platforms  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.platforms.interface import UnspecifiedPlatform  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    class HostPlatform(UnspecifiedPlatform):
        device_type = "cpu"

    # vLLM resolves its platform once, on first use, into this module global.
    vllm.platforms._current_platform = HostPlatform()
