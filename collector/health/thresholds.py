"""Where each line of the health scorecard turns amber and red: the defaults shipped beside
this module (thresholds.toml, which also lists every key), overridden key by key by the file
KVSCOPE_HEALTH_THRESHOLDS names. An unknown key, a wrong type or a negative number is bad
input: `HealthThresholdsError` names the file, the key and the reason."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from collector.toml_file import read_toml

DEFAULTS = Path(__file__).with_name("thresholds.toml")
ENVIRONMENT = "KVSCOPE_HEALTH_THRESHOLDS"

Thresholds = dict[str, dict[str, Any]]


class HealthThresholdsError(ValueError):
    """A thresholds file kvscope cannot use; the message names the file, key and reason."""


def load_thresholds(path: Path | None = None) -> Thresholds:
    """The defaults, with the values of `path` (else of the file KVSCOPE_HEALTH_THRESHOLDS
    names, if set) in their place."""
    defaults = read_toml(DEFAULTS, HealthThresholdsError)
    if path is None and os.environ.get(ENVIRONMENT):
        path = Path(os.environ[ENVIRONMENT])
    if path is None:
        return defaults
    for section, table in read_toml(path, HealthThresholdsError).items():
        if section not in defaults:
            raise HealthThresholdsError(
                f"{path}: unknown section [{section}]; known: {', '.join(defaults)}"
            )
        if not isinstance(table, dict):
            raise HealthThresholdsError(f"{path}: '{section}' must be a table ([{section}])")
        for key, value in table.items():
            _check(path, section, key, value, defaults[section])
        defaults[section] = defaults[section] | table
    return defaults


def _check(path: Path, section: str, key: str, value: Any, defaults: dict[str, Any]) -> None:
    name = f"{section}.{key}"
    if key not in defaults:
        raise HealthThresholdsError(
            f"{path}: unknown key '{name}'; [{section}] takes {', '.join(defaults)}"
        )
    if isinstance(defaults[key], list):
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise HealthThresholdsError(f"{path}: '{name}' must be a list of names")
        return
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise HealthThresholdsError(f"{path}: '{name}' must be a number, got {value!r}")
    if value < 0:
        raise HealthThresholdsError(f"{path}: '{name}' must be >= 0, got {value}")
