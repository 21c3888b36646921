"""The names a user gave prefix families (`kvscope names RUN --family KEY=NAME`), by family
(its first block's hash), kept in two places:

- the run file itself (meta key GIVEN_NAMES_KEY, one JSON object of 16-hex-digit hash to
  name), so the names travel with the run when it is shared or exported to Parquet; they
  are not part of the run's content digest (collector/store/stored_advice.py), so naming a
  family keeps the stored advice;
- the user's file ($XDG_CONFIG_HOME/kvscope/family-names.csv, else ~/.config/kvscope/...;
  rows of hash,name), for a run that is not written to (a Parquet dataset, a read-only file,
  one a live collector holds), and for every run of the same workload whose block hashes are
  the same (vLLM's hash seed fixed): a hash names the same prefix wherever it appears.

The run's own names win over the user's (collector/queries/family_keys.py, which also
leaves out a name that breaks the rules: a hand-edited file).
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

from collector.store.meta_entry import write_meta_entry
from collector.store.run_file import RunFile, StoreError

GIVEN_NAMES_KEY = "family_names"
USER_FILE = "family-names.csv"


def user_names_path() -> Path:
    """The user's file of family names."""
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "kvscope" / USER_FILE


def _from_json(document: str) -> dict[int, str]:
    try:
        loaded = json.loads(document)
    except ValueError:
        return {}
    if not isinstance(loaded, dict):
        return {}
    return {
        int(key, 16): value
        for key, value in loaded.items()
        if isinstance(value, str) and _is_hash(key)
    }


def _is_hash(text: str) -> bool:
    return len(text) == 16 and all(character in "0123456789abcdef" for character in text)


def run_names(run: RunFile) -> dict[int, str]:
    """The names kept in the run (a Parquet dataset exported from a named run keeps them in
    its meta too; one of several runs' has each run's, merged)."""
    names: dict[int, str] = {}
    for (value,) in run.rows(
        "SELECT value FROM meta WHERE key = ? ORDER BY value", [GIVEN_NAMES_KEY]
    ):
        names |= _from_json(str(value))
    return names


def read_user_names(path: Path | None = None) -> dict[int, str]:
    """The names in the user's file (none where it is missing); StoreError where it cannot be
    read or a row is not `hash,name`."""
    path = path or user_names_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as error:
        raise StoreError(f"{path}: cannot read: {error}") from error
    names = {}
    for number, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row:
            continue
        if len(row) != 2 or not _is_hash(row[0].strip()):
            raise StoreError(f"{path}: line {number} is not a 16-hex-digit hash, a comma, a name")
        names[int(row[0].strip(), 16)] = row[1]
    return names


def _changed(names: dict[int, str], changes: dict[int, str | None]) -> dict[int, str]:
    """`names` with `changes` made: a name given, or forgotten (None)."""
    merged = {**names, **changes}
    return {family: name for family, name in merged.items() if name is not None}


def write_run_names(path: Path, changes: dict[int, str | None]) -> str | None:
    """Make `changes` (a name, or None: forget the family's) to the names kept in the run
    file at `path` (no connection to it may be open in this process), in one statement; None
    when kept, else why not, in words (a dataset, a read-only file, one another process
    holds)."""

    def changed(kept: str | None) -> str:
        merged = _changed(_from_json(kept) if kept else {}, changes)
        return json.dumps({f"{family:016x}": name for family, name in merged.items()})

    return write_meta_entry(path, GIVEN_NAMES_KEY, changed)


def write_user_names(changes: dict[int, str | None], path: Path | None = None) -> None:
    """Make `changes` (a name, or None: forget the family's) to the user's file, replaced
    whole (a reader never sees half of it); StoreError where it cannot be read or written."""
    path = path or user_names_path()
    merged = _changed(read_user_names(path), changes)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    for family, name in sorted(merged.items()):
        writer.writerow([f"{family:016x}", name])
    temporary = path.with_name(f".{path.name}-{os.getpid()}")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary.write_text(buffer.getvalue(), encoding="utf-8")
        temporary.replace(path)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise StoreError(f"{path}: cannot write: {error}") from error
