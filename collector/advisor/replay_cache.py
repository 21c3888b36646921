"""The advisor's replays through vLLM, kept between views: computed the first time a run is
advised, read back after (the Advisor page's first view, `kvscope advise` again).

What the advisor replays through vLLM (the Scheduler check's token hit ratios, the CPU tier
replays) depends on the run's content, vLLM's version and kvscope's own code alone. Each
result is kept in a small JSON file in kvscope's cache folder (`$KVSCOPE_CACHE_DIR`, else
`$XDG_CACHE_HOME/kvscope`, else `~/.cache/kvscope`), under `advisor/`, named by a digest
of all three and of what was replayed:

- the run: every byte of its file (or of its Parquet dataset's files), so a run that grew
  (a live capture) or was written again is replayed again;
- vLLM: its installed version, read without importing it (a cached answer costs no vLLM
  start, about 8 s);
- kvscope: every byte of its Python sources, so a changed replay never answers from an old
  one's figures.

The run file itself is never written (the app may hold it open, and it may be read-only). A
cache folder that cannot be read or written costs the replays again, never an error.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import suppress
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from engine_hooks.versions import is_supported

FORMAT = 1  # of the files kept: a change makes every earlier one unread
_CHUNK = 1 << 20


def cache_folder() -> Path:
    """Where the advisor keeps its replays."""
    root = os.environ.get("KVSCOPE_CACHE_DIR")
    if root:
        return Path(root) / "advisor"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kvscope" / "advisor"


def _files(path: Path) -> Iterator[Path]:
    """A run file, or every file of a Parquet dataset in a fixed order."""
    if path.is_dir():
        yield from sorted(child for child in path.rglob("*") if child.is_file())
    else:
        yield path


def content_digest(path: Path) -> str:
    """A digest of every byte of the run at `path` (and of its files' names in a dataset)."""
    digest = hashlib.blake2b(digest_size=16)
    for file in _files(path):
        digest.update(str(file.relative_to(path) if file != path else "").encode())
        with file.open("rb") as stream:
            while chunk := stream.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


@cache
def code_digest() -> str:
    """A digest of kvscope's Python sources (collector/ and engine_hooks/), once a process."""
    digest = hashlib.blake2b(digest_size=16)
    root = Path(__file__).resolve().parents[2]
    for package in ("collector", "engine_hooks"):
        for source in sorted((root / package).rglob("*.py")):
            digest.update(str(source.relative_to(root)).encode())
            digest.update(source.read_bytes())
    return digest.hexdigest()


def vllm_version() -> str | None:
    """The installed vLLM's version if kvscope supports it and Python can find it to import,
    read without importing vLLM."""
    try:
        installed = version("vllm")
        importable = find_spec("vllm") is not None
    except (PackageNotFoundError, ImportError, ValueError):
        return None
    return installed if importable and is_supported(installed) else None


class ReplayCache:
    """The kept replays of one run; one that keeps nothing where vLLM is missing (the rules
    then say why they cannot replay) or the run cannot be read."""

    def __init__(self, run_path: Path, folder: Path | None = None) -> None:
        self._folder = cache_folder() if folder is None else folder
        self._prefix: str | None = None
        installed = vllm_version()
        if installed is not None:
            try:
                self._prefix = f"{FORMAT}/{installed}/{code_digest()}/{content_digest(run_path)}"
            except OSError:
                self._prefix = None

    @property
    def keeps(self) -> bool:
        """Whether this cache keeps anything (vLLM is there and the run could be read)."""
        return self._prefix is not None

    def _file(self, what: str) -> Path | None:
        if self._prefix is None:
            return None
        name = hashlib.blake2b(f"{self._prefix}/{what}".encode(), digest_size=16).hexdigest()
        return self._folder / f"{name}.json"

    def get(self, what: str) -> Any | None:
        """What was kept for `what` (a description of the replay and its settings), or None."""
        file = self._file(what)
        if file is None:
            return None
        try:
            return json.loads(file.read_text())["value"]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, what: str, value: Any) -> None:
        """Keep `value` (JSON) for `what`; written whole or not at all."""
        file = self._file(what)
        if file is None:
            return
        temporary = file.with_name(f".{file.name}.tmp-{os.getpid()}")
        try:
            file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # private, as runs are
            temporary.write_text(json.dumps({"what": what, "value": value}, sort_keys=True))
            os.replace(temporary, file)
        except OSError:
            with suppress(OSError):
                temporary.unlink(missing_ok=True)
