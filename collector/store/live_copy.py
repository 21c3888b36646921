"""The readable copy of a run file being written, `RUN.duckdb.live`, made off the writing
thread.

DuckDB lets no other process open a file while one process writes it, so `kvscope collect`
publishes a copy for readers. Making one costs what the run holds: reading the whole file,
and rebuilding `requests` and the rollups from every event (at 100 million event rows,
about 10 s and several minutes, benchmarks/large_run.py). On the writing thread that held
back every engine's batches for as long.

So the writer only folds its new rows into the eviction ages and checkpoints (both cost
what is new), and a worker thread then
- copies the file's bytes while the writer goes on appending: between checkpoints they are
  the last checkpoint's state (`RunStore.copy_file`), and the writer holds its checkpoints
  back until the copy is read (DuckDB's automatic ones are off, `checkpoint_only_when_asked`);
- rebuilds the tables derived whole in the copy, with a DuckDB of its own on `threads`
  threads and `memory_limit`, but for the cache lifetimes and the tables derived from them,
  which it carries over from the copy before and derives from what is new only
  (copy_carry.py);
- renames the copy over `RUN.duckdb.live`: readers see the old copy or the new, whole.

The copy lags the events by one copy and rebuild. While those take under PUBLISH_ALWAYS_S,
a new copy starts whenever the writer asks; beyond that, once PUBLISH_SPACING times the
last one's duration has passed since it ended, so the worker takes at most a fifth of the
time of the core it runs on.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from pathlib import Path

from collector.store.copy_carry import CopyCarry, PreviousCopy
from collector.store.run_file import RunStore, live_copy_draft_path, live_copy_path

PUBLISH_ALWAYS_S = 1.0
PUBLISH_SPACING = 4


class LiveCopy:
    """Publishes `RUN.duckdb.live` for the run file a writer holds, one copy at a time."""

    def __init__(self, store: RunStore, threads: int, memory_limit: str) -> None:
        self._store = store
        self._threads = threads
        self._memory_limit = memory_limit
        self.path = live_copy_path(store.path)
        self._temporary = live_copy_draft_path(store.path)
        self._reading = threading.Event()  # the worker reads the run file: no checkpoints
        self._worker: threading.Thread | None = None
        self._copy: RunStore | None = None  # the copy the worker rebuilds, to interrupt it
        self._closing = False
        self._last: tuple[float, float] | None = None  # when the last copy ended, its seconds
        self._carry = CopyCarry()
        self._previous: PreviousCopy | None = None  # the copy published last
        self.published = 0
        self.carried = 0  # copies whose tables were carried over from the one before (tests)
        self.failures: list[str] = []
        store.checkpoint_only_when_asked()
        self._remove_draft()  # what a collector killed while making a copy left

    def publish(self) -> bool:
        """On the writing thread: fold the new rows and checkpoint, unless a copy is being
        read; then start a new copy if none is being made and one is due. True if one
        started."""
        if self._reading.is_set():
            return False
        self._store.refresh_derived()
        self._store.checkpoint()
        if self.busy or not self._due():
            return False
        self._reading.set()
        self._worker = threading.Thread(target=self._make, name="kvscope-live-copy", daemon=True)
        self._worker.start()
        return True

    @property
    def busy(self) -> bool:
        """Whether a copy is being made."""
        return self._worker is not None and self._worker.is_alive()

    def wait(self) -> None:
        """Wait until the copy being made (if any) is published."""
        if self._worker is not None:
            self._worker.join()

    def start_over(self) -> None:
        """Wait for the copy being made (if any); the next is built whole, not carried over
        from it: the rows it was made of left the run file (a segment closed, segments.py)."""
        self.wait()
        self._previous = None

    def close(self) -> None:
        """Stop the copy being made (if any) and remove what it left half-made."""
        self._closing = True
        copy = self._copy
        if copy is not None:
            copy.interrupt()
        self.wait()
        self._remove_draft()

    def _remove_draft(self) -> None:
        """Remove the copy being made, with DuckDB's files beside it: a write-ahead log left
        there is another copy's, which DuckDB refuses to open the next one with ("WAL does
        not match database file")."""
        _remove_database(self._temporary)

    def _due(self) -> bool:
        if self._last is None:
            return True
        ended, seconds = self._last
        return seconds < PUBLISH_ALWAYS_S or time.monotonic() - ended >= PUBLISH_SPACING * seconds

    def _make(self) -> None:
        started = time.monotonic()
        try:
            try:
                self._store.copy_file(self._temporary)
            finally:
                self._reading.clear()
            if self._closing:
                raise _Closing
            with RunStore.open_copy(self._temporary) as copy:
                self._copy = copy
                copy.limit_threads(self._threads)
                copy.limit_memory(self._memory_limit)
                for _, step in copy.rebuild_steps(self._carry, self._previous):
                    step()
            os.replace(self._temporary, self.path)
            assert self._carry.marks is not None
            self._previous = PreviousCopy(self.path, self._carry.marks)
            self.published += 1
            self.carried += self._carry.carried
        except Exception as error:  # the run file is whole; the next copy tries again
            self._remove_draft()
            if self._closing:
                return  # stopped by `close`
            self._previous = None  # and builds its tables whole, whatever failed
            self.failures.append(f"{type(error).__name__}: {error}")
            print(f"kvscope collect: the live copy failed: {error}", file=sys.stderr, flush=True)
        finally:
            self._copy = None
            ended = time.monotonic()
            self._last = (ended, ended - started)


def _remove_database(path: Path) -> None:
    """Remove a DuckDB file, its write-ahead log and its spill folder, whichever exist."""
    path.unlink(missing_ok=True)
    path.with_name(path.name + ".wal").unlink(missing_ok=True)
    shutil.rmtree(path.with_name(path.name + ".tmp"), ignore_errors=True)


class _Closing(Exception):
    """The collector is finalizing the run: the copy read stays unpublished."""
