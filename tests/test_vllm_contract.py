"""vLLM's own tests of its prefix cache and scheduler, with kvscope's hooks attached to every
`KVCacheManager` and `Scheduler` they build: every test that passes without the hooks passes
with them, in each supported vLLM version whose tests .ci/setup fetched (.vllm-tests/VERSION,
from vLLM's source archive on the package index; 0.32's cannot be fetched here).

Each version's two files run twice, side by side, in a pytest of that version's environment
(cwd: the version folder): once bare, once with tests/vllm_contract/hooks_everywhere.py,
which counts the managers hooked, the layouts the hooks refuse (by reason) and the hooks' own
failures (each caught by the hooks, vLLM's call going on). Both runs load
tests/vllm_contract/host_platform.py (a CPU machine: vLLM's tests ask the platform for its
device) and find the models the tests name in a Hugging Face cache of their configs and
tokenizers (tests/vllm_contract/models.py). A test that fails without hooks says nothing about
them: it is left out, and counted. Each version's summary goes straight to CI's log.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import IO, Any

import pytest

from tests.support.repo import REPO
from tests.vllm_contract.models import write_cache

pytestmark = pytest.mark.slow

ENVIRONMENTS = {"0.34.0": REPO / ".venv", "0.33.0": REPO / ".venv-vllm-033"}
VLLM_TESTS = REPO / ".vllm-tests"
CONTRACT = REPO / "tests" / "vllm_contract"
FILES = ("tests/v1/core/test_prefix_caching.py", "tests/v1/core/test_scheduler.py")
# What the two files import from vLLM's tests besides tests/v1/core (MockKVConfig and friends).
HELPERS = ("tests/v1/core/utils.py", "tests/v1/kv_connector/unit/utils.py", "tests/utils.py")
TIMEOUT_S = 1500

# The hooks' own failures these tests meet, and why: the hooks' failure path catches each,
# capture of that manager stops, and vLLM's test passes. vLLM's regression tests of its
# issue #33775 take blocks from the head of the free queue, which never held KV, and hand
# them to `allocate_slots` as a prefix hit of one or more groups ("stand-ins for evictable
# cache-hit blocks"): `BlockPool.touch` is given blocks without a hash, and a prefix hit
# without hashes is nothing the hooks can record.
EXPECTED_FAILURES = {
    "test_cache_hit_local_and_external",
    "test_cache_hit_local_and_external_three_groups",
    "test_cache_hit_local_and_external_three_groups_preempt_and_reallocate",
    "test_cache_hit_local_and_external_two_groups_preempt_and_reallocate",
}


def outcomes(junit: Path) -> dict[str, str]:
    """Each test's outcome (passed, failed, error, skipped) in a JUnit XML report; a test with
    a failing teardown counts as an error."""
    results: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case} & {"failure", "error", "skipped"}
        outcome = "error" if "error" in kinds else next(iter(kinds), "passed")
        if results.get(test, "passed") == "passed":
            results[test] = outcome
    return results


def vllm_pytest(
    python: Path, folder: Path, out: Path, hf_home: Path, log: IO[str], *, hooks: bool
) -> subprocess.Popen[str]:
    """vLLM's two test files in `folder`, bare or with the hooks; its reports go to `out`."""
    environment = {
        name: value for name, value in os.environ.items() if not name.startswith("KVSCOPE_")
    }
    environment |= {
        "PYTHONPATH": str(CONTRACT),
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "KVSCOPE_CONTRACT_COUNTS": str(out / "counts.json"),
    }
    plugins = ["-p", "host_platform"] + (["-p", "hooks_everywhere"] if hooks else [])
    command = [str(python), "-m", "pytest", "-c", str(CONTRACT / "pytest-vllm.ini")]
    command += ["--rootdir", str(folder), "-q", *plugins, f"--junitxml={out / 'junit.xml'}"]
    return subprocess.Popen(
        [*command, *FILES], cwd=folder, env=environment, stdout=log, stderr=subprocess.STDOUT
    )


def run_both(python: Path, folder: Path, tmp_path: Path) -> dict[str, Path]:
    """Both runs side by side (a core each); each one's folder of reports, by name."""
    hf_home = write_cache(tmp_path / "hf")
    runs = {"bare": tmp_path / "bare", "hooked": tmp_path / "hooked"}
    with contextlib.ExitStack() as stack:
        processes = []
        for name, out in runs.items():
            out.mkdir()
            log = stack.enter_context((out / "output.txt").open("w"))
            process = vllm_pytest(python, folder, out, hf_home, log, hooks=name == "hooked")
            stack.callback(process.kill)  # does nothing to one that ended
            processes.append(process)
        for process in processes:
            process.wait(timeout=TIMEOUT_S)
    for out in runs.values():
        assert (out / "junit.xml").is_file(), (out / "output.txt").read_text()[-6000:]
    return runs


def summary(version: str, bare: dict[str, str], hooked: dict[str, str], counts: Any) -> str:
    passed = [sum(outcome == "passed" for outcome in run.values()) for run in (bare, hooked)]
    refused = Counter(counts["refused"])
    failures = Counter()
    for failure in counts["failures"]:
        failures[f"{failure['test']}: {failure['failure']}"] += failure["num_failures"]
    lines = [
        f"vLLM {version}'s core tests with kvscope's hooks: {len(bare)} tests, {passed[0]} "
        f"passed without hooks, {passed[1]} with them",
        f"  left out, not passing without hooks: {len(bare) - passed[0]}",
        *(f"    {outcome} {test}" for test, outcome in bare.items() if outcome != "passed"),
        f"  managers hooked: {counts['hooked']} ({counts['hooked_by_scheduler']} through a "
        f"scheduler, in {len(counts['tests_hooked'])} tests), {counts['records']} records",
        f"  managers refused: {refused.total()}",
        *(f"    {n} {reason}" for reason, n in refused.most_common()),
        f"  hook failures: {failures.total()}, in {len(counts['failures'])} managers",
        *(f"    {n} {where}" for where, n in failures.items()),
    ]
    return "\n".join(lines)


@pytest.mark.parametrize("version", list(ENVIRONMENTS))
def test_vllm_core_tests_pass_with_the_hooks(
    version: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = VLLM_TESTS / version
    python = ENVIRONMENTS[version] / "bin" / "python"
    for needed in (python, *(folder / name for name in FILES + HELPERS)):
        if not needed.is_file():
            pytest.fail(f"{needed} is missing: run .ci/setup")
    started = time.monotonic()
    runs = run_both(python, folder, tmp_path)
    took = time.monotonic() - started
    bare, hooked = (outcomes(runs[name] / "junit.xml") for name in ("bare", "hooked"))
    counts = json.loads((runs["hooked"] / "counts.json").read_text())
    with capsys.disabled():  # in CI's log, passed or not
        print(f"\n{summary(version, bare, hooked, counts)}\n  both runs side by side: {took:.0f} s")

    assert counts["vllm_version"] == version
    assert set(hooked) == set(bare)
    passed = {test for test, outcome in bare.items() if outcome == "passed"}
    # The environment works: vLLM's tests pass here (those left out need what it lacks).
    assert len(passed) >= 0.9 * len(bare), sorted(set(bare) - passed)
    broken = sorted(test for test in passed if hooked[test] != "passed")
    assert not broken, (runs["hooked"] / "output.txt").read_text()[-8000:]
    # The hooks were on: most managers hooked, and none failed to attach.
    assert counts["attach_errors"] == {}
    assert counts["hooked"] > 2 * sum(counts["refused"].values())
    assert counts["records"] > 0
    unexpected = [
        failure
        for failure in counts["failures"]
        if failure["test"].rpartition("::")[2].partition("[")[0] not in EXPECTED_FAILURES
    ]
    assert not unexpected
