"""A TOML file a user hands kvscope (the report's and the health scorecard's thresholds), read
whole or refused with one line naming the file and why."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any


def read_toml(path: Path, error: type[ValueError]) -> dict[str, Any]:
    """The file's tables; `error` (a ValueError naming `path`) when it is missing, unreadable
    or not TOML."""
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError as missing:
        raise error(f"{path}: no such thresholds file") from missing
    except OSError as unreadable:
        raise error(f"{path}: cannot read: {unreadable.strerror}") from unreadable
    except tomllib.TOMLDecodeError as bad:
        raise error(f"{path}: not valid TOML: {bad}") from bad
