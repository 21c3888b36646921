"""A file's bytes, read while DuckDB holds the file open for writing (`RunStore.copy_file`)."""

from __future__ import annotations

import os
from pathlib import Path

COPY_CHUNK_BYTES = 16 << 20


class FileBytes:
    """The bytes of the file at `path`.

    A run file's bytes between checkpoints are the last checkpoint's state: DuckDB writes
    the file's header, and the blocks it names, only while checkpointing; appends go to the
    write-ahead log or to blocks that header does not name, as a crash at any moment must
    find the file consistent.

    The file is read through one descriptor kept open until `close`: closing any descriptor
    of a file drops the process's POSIX locks on it, DuckDB's among them, and other
    processes could then open the run file while it is written."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._reader: int | None = None

    def read(self, offset: int) -> bytes:
        """Up to COPY_CHUNK_BYTES from `offset` on (none past the end)."""
        if self._reader is None:
            self._reader = os.open(self._path, os.O_RDONLY)
        return os.pread(self._reader, COPY_CHUNK_BYTES, offset)

    def close(self) -> None:
        if self._reader is not None:
            os.close(self._reader)
            self._reader = None
