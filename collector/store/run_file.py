"""One DuckDB file per run: `RunFile` owns the connection a run is read through, and
`RunStore` is a run file open for writing (create, append records in Arrow batches, finish).

Nothing outside `collector.store` touches DuckDB: the query modules hand their SQL to a
`RunFile` and get rows or a data frame back. The checks a run file passes before it is
opened, and `StoreError`, are in run_opening.py; its config, and the new file it is written
into, in run_config.py."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import duckdb
import pandas as pd
import pyarrow as pa

from collector.store.cache_mirror import CacheMirrors
from collector.store.copy_carry import CopyCarry, PreviousCopy
from collector.store.derived_tables import DerivedTables, Step, rebuild_steps
from collector.store.file_bytes import FileBytes
from collector.store.ingest import to_batch
from collector.store.integrity import damage_met, record_contents
from collector.store.parquet_dataset import dataset_connection, is_dataset
from collector.store.resume_point import ResumePoint, resume_point
from collector.store.run_config import RunConfig, create_run_file
from collector.store.run_opening import (
    ATTACHED_AS,
    RUN_TABLES,
    ReadError,
    RunBeingWritten,
    StoreError,
    connect,
    live_copy_draft_path,
    live_copy_path,
    open_checked,
)
from collector.store.segmented_run import open_run
from engine_hooks.events import Event

# What the store's readers import from here, opening's names among them (run_opening.py).
__all__ = [
    "RUN_TABLES",
    "ReadError",
    "RunBeingWritten",
    "RunConfig",
    "RunFile",
    "RunStore",
    "StoreError",
    "live_copy_draft_path",
    "live_copy_path",
    "open_readable",
    "run_file_problem",
]

FLUSH_RECORDS = 250_000


Parameters = Sequence[object] | Mapping[str, object] | None


class RunFile:
    """A run file open for reading: it owns the DuckDB connection, checks the file when it
    opens it, and runs the query modules' SQL, handing back rows or a data frame."""

    def __init__(
        self, connection: duckdb.DuckDBPyConnection, path: Path, attached: bool = False
    ) -> None:
        self._connection = connection
        self.path = path
        self._attached = attached  # the run is the database `run` attached to an in-memory one

    @classmethod
    def open(cls, path: Path, read_only: bool = True) -> Self:
        """Open an existing run file, checking that it is an undamaged run of the schema
        version this kvscope reads; or a run exported as a Parquet dataset, read only."""
        if is_dataset(path):
            return cls.open_dataset([path])
        return cls(*open_run(path, read_only))  # or a segmented run (segmented_run.py)

    @classmethod
    def open_dataset(cls, directories: Sequence[Path]) -> Self:
        """One or several Parquet datasets (or one folder several were copied into) read as
        one run (parquet_dataset.py)."""
        return cls(dataset_connection(directories), directories[0])

    @classmethod
    def open_live_copy(cls, path: Path) -> Self:
        """Open a live copy (`RUN.duckdb.live`) for reading, checked as `open` checks. A
        collector replaces the copy under the same name, and DuckDB hands a connection to
        a path the database it already has open there, while any connection to it lives:
        the copy before. So each copy is attached to a database of its own."""
        return cls(*open_run(path, read_only=True, own_database=True))

    def rows(self, sql: str, parameters: Parameters = None) -> list[tuple[Any, ...]]:
        with self._reading():
            return self._connection.execute(sql, parameters).fetchall()

    def row(self, sql: str, parameters: Parameters = None) -> tuple[Any, ...] | None:
        """The first row, or None when there is none."""
        with self._reading():
            return self._connection.execute(sql, parameters).fetchone()

    def record(self, sql: str, parameters: Parameters = None) -> dict[str, Any] | None:
        """The first row as a dict by column name, or None when there is none."""
        with self._reading():
            cursor = self._connection.execute(sql, parameters)
            names = [column[0] for column in cursor.description]
            row = cursor.fetchone()
        return None if row is None else dict(zip(names, row, strict=True))

    def frame(self, sql: str, parameters: Parameters = None) -> pd.DataFrame:
        with self._reading():
            return self._connection.execute(sql, parameters).df()

    def arrow(self, sql: str, parameters: Parameters = None) -> pa.Table:
        # A cursor of its own: DuckDB's relation API refuses a connection with a result
        # still open (as `row` leaves one).
        with self._reading():
            return self._own_cursor().sql(sql, params=parameters).to_arrow_table()

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """Damage a query meets that opening the run did not look for (a block of a run file
        over integrity.FULL_CHECK_BYTES) refused as opening refuses it, naming the run."""
        try:
            yield
        except duckdb.Error as error:
            if not damage_met(error):
                raise
            reason = str(error).splitlines()[0]
            raise StoreError(
                f"{self.path}: the run is damaged where a query read it: {reason}"
            ) from error

    def cursor(self) -> RunFile:
        """The same run through a cursor of its own (one per thread, as Streamlit runs pages)."""
        return RunFile(self._own_cursor(), self.path, self._attached)

    def _own_cursor(self) -> duckdb.DuckDBPyConnection:
        cursor = self._connection.cursor()
        if self._attached:
            cursor.execute(f"USE {ATTACHED_AS}")  # a cursor starts in the in-memory database
        return cursor

    @property
    def finished(self) -> bool:
        """Whether the run was finalized (its collector or replay ended cleanly)."""
        row = self.row("SELECT finished_at IS NOT NULL FROM runs")
        return bool(row and row[0])

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class RunStore(RunFile):
    """A run file open for writing: created (`create`) or an unfinished one resumed."""

    def __init__(
        self, connection: duckdb.DuckDBPyConnection, path: Path, attached: bool = False
    ) -> None:
        super().__init__(connection, path, attached)
        self.resumed = ResumePoint()  # where a resumed run goes on (resume_point.py)
        self._pending: list[Event] = []
        row = self.row("SELECT num_blocks FROM runs")
        self._mirrors = CacheMirrors(int(row[0]) if row and row[0] else 0)
        self.num_records = 0
        self.num_rows = 0
        self._derived = DerivedTables(connection)
        self._bytes = FileBytes(path)  # the run file's, for copy_file

    @classmethod
    def create(cls, path: Path, config: RunConfig) -> Self:
        """Create a new run file (run_config.py); refuses to overwrite one."""
        create_run_file(path, config)
        return cls(connect(path), path)

    @classmethod
    def open_copy(cls, path: Path) -> Self:
        """Open a copy of a run file being written (live_copy.py), to rebuild its tables
        derived whole; unchecked: the copy was made a moment ago from a checked file."""
        return cls(connect(path), path)

    @classmethod
    def resume(cls, path: Path) -> Self:
        """Open a run its collector never finished (killed) to write on; refuse a finished
        one, as kvscope never overwrites runs."""
        with RunFile.open(path) as run:  # checked before a byte is written; segmented: whole
            point = resume_point(run)
        store = cls(open_checked(path, read_only=False), path)
        if store.finished:
            store.close()
            raise StoreError(f"{path}: a finished run; kvscope does not overwrite runs")
        if point.block_states is not None:
            store._mirrors.restore(point.block_states)
        if point.eviction_state is not None:  # segmented: its closed segments' state
            store._derived.seed_eviction_ages(point.eviction_state)
        store.resumed = point
        return store

    @property
    def source(self) -> str:
        """Where the run's settings came from: "engine", "replay", "vllm-kv-events"."""
        row = self.row("SELECT source FROM runs")
        return str(row[0]) if row else ""

    def update_config(self, config: RunConfig) -> None:
        """Replace the run's settings, keeping its id and start (and the options it had)."""
        row = self.row("SELECT options FROM runs")
        options = {**json.loads(row[0] or "{}"), **config.options} if row else config.options
        self._connection.execute(
            "UPDATE runs SET source = ?, block_size = ?, num_blocks = ?, hash_algo = ?, "
            "vllm_version = ?, trace = ?, timing = ?, max_num_seqs = ?, options = ?",
            [
                config.source,
                config.block_size,
                config.num_blocks,
                config.hash_algo,
                config.vllm_version,
                config.trace,
                config.timing,
                config.max_num_seqs,
                json.dumps(options, sort_keys=True),
            ],
        )

    def note_capture_stopped(self, engine_id: str, dp_rank: int, reason: str) -> None:
        """Record that an engine's hooks stopped capturing, and why (`meta`, one key per
        engine and DP rank: "capture_stopped ENGINE dpRANK")."""
        self._connection.execute(
            "INSERT OR REPLACE INTO meta VALUES (?, ?)",
            [f"capture_stopped {engine_id} dp{dp_rank}", reason],
        )

    def append(self, records: list[Event]) -> list[Event]:
        """Complete the engines' records from the mirrors of their caches (the evictions on
        reuse, the cached-free and cleared counts: `cache_mirror.py`) and queue them; they
        reach the file in batches of about FLUSH_RECORDS. Returns the records as stored."""
        completed = self._mirrors.complete(records)
        self._pending.extend(completed)
        if len(self._pending) >= FLUSH_RECORDS:
            self.flush()
        return completed

    def flush(self) -> None:
        """Write every queued record in one transaction."""
        if not self._pending:
            return
        batch = to_batch(self._pending)
        self.num_records += len(self._pending)
        self._pending = []
        self.insert(dict(batch.tables()))

    def insert(self, tables: Mapping[str, pa.Table]) -> None:
        """Append each Arrow table to the run table of its name, all in one transaction."""
        connection = self._connection
        connection.begin()
        try:
            for name, table in tables.items():
                if table.num_rows:
                    self.num_rows += table.num_rows
                    connection.register("_batch", table)
                    connection.execute(f"INSERT INTO {name} BY NAME SELECT * FROM _batch")
                    connection.unregister("_batch")
        except BaseException:
            connection.rollback()
            raise
        connection.commit()

    def rows_removed(self) -> None:
        """The record tables' rows were deleted and checkpointed (segments.py)."""
        self._derived.rows_removed()

    def refresh_derived(self, rebuild: bool = False) -> None:
        """Flush, then fold the rows new since the last refresh into the eviction ages, and
        rebuild the tables derived whole if `rebuild` (`collector/store/derived_tables.py`)."""
        self.flush()
        self._derived.refresh(rebuild)

    def refresh_steps(self, rebuild: bool) -> list[Step]:
        """What `refresh_derived` does after flushing, in order, each named by what it
        derives (the benchmarks time them one by one)."""
        return self._derived.steps(rebuild)

    def rebuild_steps(
        self, carry: CopyCarry | None = None, previous: PreviousCopy | None = None
    ) -> list[Step]:
        """The statements that rebuild this file's tables derived whole, each named; with
        `carry`, the cache lifetimes and the tables derived from them carried over from the
        `previous` copy where they can be (`collector/store/copy_carry.py`)."""
        return rebuild_steps(self._connection, carry, previous)

    def checkpoint(self) -> None:
        """Write everything committed into the file itself (and its header naming it)."""
        self._connection.execute("CHECKPOINT")

    def checkpoint_only_when_asked(self) -> None:
        """Turn off DuckDB's automatic checkpoints (at 16 MB of write-ahead log): a live
        copy reads the file between two `checkpoint` calls (live_copy.py)."""
        self._connection.execute("SET wal_autocheckpoint = '1TB'")

    def copy_file(self, destination: Path) -> None:
        """Write the bytes of the run file to `destination` (FileBytes: what they hold
        between checkpoints, and why they are read through a descriptor of their own)."""
        with destination.open("wb") as copy:
            offset = 0
            while chunk := self._read_chunk(offset):
                copy.write(chunk)
                offset += len(chunk)

    def _read_chunk(self, offset: int) -> bytes:
        return self._bytes.read(offset)

    def interrupt(self) -> None:
        """Stop the statement this store's connection runs (from another thread); nothing
        when the connection closed meanwhile (what it ran is done)."""
        with contextlib.suppress(duckdb.ConnectionException):
            self._connection.interrupt()

    def close(self) -> None:
        super().close()
        self._bytes.close()  # after DuckDB let go of the file and of its lock

    def limit_memory(self, limit: str) -> None:
        """Let DuckDB hold at most `limit` (e.g. "6GB") in memory for this store's work, the
        final rebuild included; beyond it, it spills to `<run file>.tmp/`."""
        self._connection.execute("SET memory_limit = ?", [limit])

    def limit_threads(self, threads: int) -> None:
        """Let DuckDB use at most `threads` threads for this store's work until `finalize`."""
        self._connection.execute(f"SET threads = {int(threads)}")

    def finalize(self, vllm_prefix_cache: tuple[int, int] | None = None) -> None:
        """Flush, bring every derived table up to date (with every core DuckDB would use:
        the engines are done), stamp the run as finished with its record of what it holds
        (integrity.py), and remove the live copy a collector published of it (readers now
        read the run itself)."""
        self._connection.execute("RESET threads")
        self._connection.execute("RESET wal_autocheckpoint")
        self.refresh_derived(rebuild=True)
        queries, hits = vllm_prefix_cache if vllm_prefix_cache else (None, None)
        self._connection.begin()
        self._connection.execute(
            "UPDATE runs SET finished_at = ?, vllm_prefix_cache_queries = ?, "
            "vllm_prefix_cache_hits = ?",
            [datetime.now(UTC).replace(tzinfo=None), queries, hits],
        )
        record_contents(self._connection)
        self._connection.commit()
        live_copy_path(self.path).unlink(missing_ok=True)
        live_copy_draft_path(self.path).unlink(missing_ok=True)  # a killed collector's


def run_file_problem(path: Path) -> str | None:
    """Why `path` is not a kvscope run this kvscope reads (not DuckDB, no kvscope tables,
    another schema version, damaged; a dataset likewise), or None: it is one, or one being
    written."""
    try:
        RunFile.open(path).close()
    except RunBeingWritten:
        return None
    except StoreError as error:
        return str(error).removeprefix(f"{path}: ")
    return None


def open_readable(run_path: Path) -> tuple[RunFile, bool]:
    """Open a run for reading: the file itself, or, while `kvscope collect` is writing it
    (DuckDB then lets no other process open it), its latest live copy. True means live."""
    try:
        return RunFile.open(run_path), False
    except RunBeingWritten:
        live = live_copy_path(run_path)
        if not live.is_file():
            raise
        return RunFile.open_live_copy(live), True
