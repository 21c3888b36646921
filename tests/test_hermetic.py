"""The suite keeps out of the user's home (tests/support/private_home.py): what a home holds,
as a Ray token an earlier `kvscope whatif --ray` left there, reaches no test, and no test
writes there."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from engine_hooks.privacy import SECRET_FILE
from tests.support.private_home import DROPPED, PRIVATE_FOLDERS
from tests.support.repo import REPO

STALE_TOKEN = "0123456789abcdef0123456789abcdef"  # no cluster's: left by an earlier Ray
RAY_TEST = "tests/test_whatif_ray.py::test_a_sweep_on_ray_equals_the_local_pool_point_for_point"


def test_the_session_runs_in_a_home_of_its_own() -> None:
    home = Path.home()
    assert home != Path(pwd.getpwuid(os.getuid()).pw_dir)
    assert home.parent.name.startswith("kvh-")
    assert os.environ["RAY_TMPDIR"] == str(home.parent)
    for name, folder in PRIVATE_FOLDERS.items():
        assert os.environ[name] == str(home / folder)
    assert not set(DROPPED) & set(os.environ)
    assert SECRET_FILE.is_relative_to(home)


@pytest.mark.slow  # the Ray sweep test, in a pytest of its own
def test_a_ray_token_in_the_users_home_reaches_no_test(tmp_path: Path) -> None:
    user_home = tmp_path / "home"
    token = user_home / ".ray" / "auth_token"
    token.parent.mkdir(parents=True)
    token.write_text(STALE_TOKEN)
    # The user's environment: their home, none of this session's private folders.
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in {*PRIVATE_FOLDERS, "RAY_TMPDIR"}
    }
    environment["HOME"] = str(user_home)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", RAY_TEST]
    command += ["--basetemp", str(tmp_path / "basetemp")]
    result = subprocess.run(
        command, cwd=REPO, env=environment, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "1 passed" in result.stdout
    written = sorted(str(path.relative_to(user_home)) for path in user_home.rglob("*"))
    assert written == [".ray", ".ray/auth_token"]  # nothing read it into a test, nor wrote
    assert token.read_text() == STALE_TOKEN
