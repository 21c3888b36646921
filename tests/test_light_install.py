"""The base install reads, collects, shows and reports without vLLM or torch: here they are
made unimportable in a subprocess, and every run-file command and the app still work; the
commands that replay say what they need and write nothing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.support.python_script import run_python
from tests.support.repo import REPO, SAMPLE_RUN, SAMPLE_TRACE

WITHOUT_VLLM = """
import sys

class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("vllm", "torch", "transformers"):
            raise ImportError(f"No module named {name!r} (hidden by the test)")
        return None

sys.meta_path.insert(0, Absent())
"""


def run_without_vllm(script: str) -> subprocess.CompletedProcess[str]:
    return run_python(WITHOUT_VLLM + script, check=False, timeout=600)


def kvscope_without_vllm(*args: str) -> subprocess.CompletedProcess[str]:
    script = f"from collector.cli import main; sys.exit(main({list(args)!r}))"
    return run_without_vllm(script)


def test_run_file_commands_need_no_vllm(tmp_path: Path) -> None:
    summary = kvscope_without_vllm("summary", str(SAMPLE_RUN), "--json")
    assert summary.returncode == 0, summary.stderr
    assert json.loads(summary.stdout)["requests"] == 500
    advise = kvscope_without_vllm("advise", str(SAMPLE_RUN), "--json", "--no-store")
    assert advise.returncode == 0, advise.stderr
    report = kvscope_without_vllm(
        "report",
        "--baseline",
        str(SAMPLE_RUN),
        "--candidate",
        str(SAMPLE_RUN),
        "--out-dir",
        str(tmp_path / "report"),
    )
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "report" / "report.html").is_file()
    collect = kvscope_without_vllm("collect", "--help")
    assert collect.returncode == 0, collect.stderr


def test_the_app_needs_no_vllm() -> None:
    script = (
        "from streamlit.testing.v1 import AppTest\n"
        f"app = AppTest.from_file({str(REPO / 'visualizer' / 'app.py')!r}, default_timeout=120)\n"
        f"app.session_state['run_path'] = {str(SAMPLE_RUN)!r}\n"
        "app.run()\n"
        "assert not app.exception, app.exception\n"
        "print({metric.label: metric.value for metric in app.metric}['Requests'])\n"
    )
    result = run_without_vllm(script)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.strip().splitlines()[-1] == "500"


def test_replay_and_whatif_say_what_they_need_and_write_nothing(tmp_path: Path) -> None:
    run, sweep = tmp_path / "run.duckdb", tmp_path / "sweep"
    replay = kvscope_without_vllm("replay", str(SAMPLE_TRACE), "--out", str(run), "--quiet")
    whatif = kvscope_without_vllm("whatif", str(SAMPLE_TRACE), "--out", str(sweep), "--quiet")
    for result in (replay, whatif):
        assert result.returncode == 2
        assert "Traceback" not in result.stderr
        assert "need vLLM 0.32.x, 0.33.x, 0.34.x in this Python environment" in result.stderr
        assert "pip install 'kvscope[vllm]'" in result.stderr
    assert list(tmp_path.iterdir()) == []
