"""One line of `kvscope doctor`'s screen (doctor_checks.py runs them all): OK, WARN or FAIL,
with a reason and, unless OK, what to do about it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

OK, WARN, FAIL = "OK", "WARN", "FAIL"

REPORT = "a kvscope defect in this vLLM: report it with `kvscope doctor --json`'s output"


@dataclass(frozen=True)
class Check:
    """One line of the doctor's screen; `fix` says what to do when it is not OK."""

    status: str
    name: str
    reason: str
    fix: str = ""
    detail: str = ""  # more of the reason, for `--json` only (e.g. the hooks' own message)
    figures: Mapping[str, float | int | str] = field(default_factory=dict)
