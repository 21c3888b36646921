"""A home of the test session's own (tests/conftest.py enters it before any test module is
imported): nothing the user's home holds reaches a test, and no test writes there.

Ray's token (~/.ray/auth_token, which a local `ray.init()` leaves behind: a Ray a test
starts would take it up, and the test's driver, without it, be refused) and its session
folders, the kvscope secret, Streamlit's and vLLM's configuration and caches all land in a
temporary folder, removed at the end. The variables that would point Ray elsewhere
(RAY_ADDRESS, RAY_AUTH_*) are dropped. A model cache is reached through HF_HOME, left as the
user set it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

# Where the user's own configuration and caches would otherwise be read or written.
PRIVATE_FOLDERS = {
    "XDG_CONFIG_HOME": ".config",
    "XDG_CACHE_HOME": ".cache",
    "XDG_DATA_HOME": ".local/share",
    "XDG_STATE_HOME": ".local/state",
}
DROPPED = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
_FOUND: dict[str, str | None] = {}  # each variable as the session found it
_PRIVATE: list[Path] = []


def enter() -> Path:
    """HOME, the XDG folders and Ray's temp folder (RAY_TMPDIR) in a new private folder,
    short: Ray's socket paths live under it. The new home."""
    private = Path(tempfile.mkdtemp(prefix="kvh-"))
    _PRIVATE.append(private)
    home = private / "home"
    settings = {"HOME": str(home), "RAY_TMPDIR": str(private)}
    settings |= {name: str(home / folder) for name, folder in PRIVATE_FOLDERS.items()}
    for folder in (home, *(home / folder for folder in PRIVATE_FOLDERS.values())):
        folder.mkdir(parents=True, exist_ok=True)
    for name in (*settings, *DROPPED):
        _FOUND.setdefault(name, os.environ.get(name))
        os.environ.pop(name, None)
    os.environ.update(settings)
    return home


def leave() -> None:
    """The variables as the session found them; the private folder removed."""
    for name, value in _FOUND.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _FOUND.clear()
    while _PRIVATE:
        shutil.rmtree(_PRIVATE.pop(), ignore_errors=True)
