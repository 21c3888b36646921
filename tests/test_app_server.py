"""The app's server (`visualizer/server.py`, as `kvscope app` starts it) imports kvscope's
collector before it listens, so the first page's script does not: every module of it, and
none of vLLM or torch (a page that replays imports vLLM itself, on its first view)."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import collector
from tests.support.repo import REPO


def test_the_app_server_preloads_the_collector_and_not_vllm() -> None:
    code = (
        "import json, sys; from visualizer import server; server.preload_collector(); "
        "print(json.dumps(sorted(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    modules = set(json.loads(result.stdout))
    wanted = {module.name for module in pkgutil.walk_packages(collector.__path__, "collector.")}
    assert wanted <= modules, sorted(wanted - modules)
    assert {"pandas", "plotly.graph_objects", "duckdb"} <= modules
    assert not {name.split(".")[0] for name in modules} & {"vllm", "torch", "transformers"}
