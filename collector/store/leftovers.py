"""The temporary files a kvscope command writes a run under before renaming it into place,
and those an interrupted one left behind.

A run is written as `.NAME.duckdb.tmp-PID` (a replay, a what-if point) or
`.NAME.duckdb.creating-PID` (a new run file's schema), and a dataset as
`.NAME.exporting-PID`; DuckDB adds `FILE.wal` and a spill folder `FILE.tmp` beside a file it
writes. A command killed meanwhile leaves them. No command reads one as a run (`RunFile.open`
refuses it, naming the command's process), and the next command writing the same run, or
into the same folder, removes those whose process is gone (`remove_leftovers`).
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

_TEMPORARY = re.compile(r"\.(?P<target>.+)\.(?P<stage>tmp|creating|exporting)-(?P<pid>\d+)")
_DUCKDB_COMPANIONS = (".wal", ".tmp")  # DuckDB's write-ahead log and spill folder


@dataclass(frozen=True)
class Leftover:
    """A temporary file (or folder) of a kvscope command, named by the process writing it."""

    path: Path
    target: str  # the name it is renamed to when done
    pid: int

    @property
    def running(self) -> bool:
        """Whether the process that wrote it is still running (or another process took its
        number since: then it is kept, and still never read as a run)."""
        if not 0 < self.pid < 2**31:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True  # another user's
        return True

    def describe(self) -> str:
        state = "still running" if self.running else "interrupted: it is no longer running"
        return (
            f"a temporary file of a kvscope command writing {self.target} (process "
            f"{self.pid}, {state}), not a run"
        )


def leftover(path: Path) -> Leftover | None:
    """The leftover `path` is, if its name is a kvscope temporary file's (or DuckDB's file
    beside one)."""
    name = path.name
    for companion in _DUCKDB_COMPANIONS:
        if name.endswith(companion) and _TEMPORARY.fullmatch(name.removesuffix(companion)):
            name = name.removesuffix(companion)
    match = _TEMPORARY.fullmatch(name)
    if match is None or not _is_run_target(match["target"], match["stage"]):
        return None
    return Leftover(path, match["target"], int(match["pid"]))


def _is_run_target(target: str, stage: str) -> bool:
    """Runs and datasets only: other tools name their temporary files alike."""
    return stage == "exporting" or target.endswith(".duckdb") or ".duckdb." in target


def remove_leftovers(folder: Path) -> list[Path]:
    """Remove the temporary files in `folder` that kvscope commands no longer running left
    (with DuckDB's files beside them); the paths removed."""
    if not folder.is_dir():
        return []
    removed = []
    for path in sorted(folder.iterdir()):
        found = leftover(path)
        if found is None or found.running:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed
