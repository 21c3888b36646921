"""The example CI workflow (docs/ci/prefix-cache-regression.yml): its kvscope commands run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from collector.cli import main
from collector.report.markdown import MARKER
from tests.support.repo import REPO

WORKFLOW = REPO / "docs" / "ci" / "prefix-cache-regression.yml"


def kvscope_commands(workflow: dict[str, Any]) -> list[list[str]]:
    """Each `kvscope ...` line of the job's run steps, its $VARIABLES taken from `env`."""
    environment = workflow["env"]
    commands = []
    for step in workflow["jobs"]["report"]["steps"]:
        for line in step.get("run", "").splitlines():
            if line.strip().startswith("kvscope "):
                expanded = re.sub(r"\$(\w+)", lambda match: environment[match[1]], line)
                commands.append(shlex.split(expanded)[1:])
    return commands


def test_the_workflow_paths_exist() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    for name in ("TEMPLATES", "PROMPT_SET", "THRESHOLDS"):
        assert (REPO / workflow["env"][name]).exists(), name
    assert [command[0] for command in kvscope_commands(workflow)] == [
        "prompt-trace",
        "prompt-trace",
        "report",
    ]


def test_the_workflow_commands_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both checkouts are this repository: the prompts did not change, so the report passes."""
    (tmp_path / "baseline").symlink_to(REPO)
    (tmp_path / "candidate").symlink_to(REPO)
    monkeypatch.chdir(tmp_path)
    for command in kvscope_commands(yaml.safe_load(WORKFLOW.read_text())):
        assert main(command) == 0, capsys.readouterr().err
    markdown = (tmp_path / "kvscope-report" / "report.md").read_text()
    assert markdown.startswith(f"{MARKER}\n### ✅ kvscope: prefix caching holds (12 checks passed)")
    assert "`tenant_hit_ratio[support]`" in markdown
    assert (tmp_path / "kvscope-report" / "junit.xml").is_file()
