"""CPU time another process has used, from /proc/PID/stat (Linux)."""

from __future__ import annotations

import os
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> int:
    """User + system clock ticks of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def cpu_seconds(pid: int) -> float:
    return cpu_ticks(pid) / CLOCK_TICKS
