"""A segmented run's writing side: `Segments` closes the open segment of a run file being
written (its head) into immutable Parquet files, and drops the oldest closed segments that
retention no longer keeps (docs/run-files.md, Segmented runs; segmented_run.py reads them).

Closing writes the segment's rows of the record tables under a temporary folder, with the
cache lifetimes derived from them on from the segment before (segment_lifetimes.py), moves
the files into place, then writes the segment's manifest; only then, in one transaction of the
head, are those rows deleted and `meta` told the segment is closed (NEXT_KEY). A collector
killed before that transaction finds, on resuming, files of a segment its head does not
count: it removes them, and the rows, still in the head, go into the segment again. So an
acknowledged record is never lost, nor read twice."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb

from collector.store.live_copy import LiveCopy
from collector.store.run_file import RunStore, StoreError
from collector.store.segment_lifetimes import CARRIED, write_segment
from collector.store.segmented_run import (
    DIR_KEY,
    FIRST_KEY,
    MANIFESTS,
    NEXT_KEY,
    ORIGIN_KEY,
    RECORD_TABLES,
    RETENTION_KEY,
    segment_stem,
)
from collector.store.sql_literal import path_literal

ENGINE_TABLES = ("collisions", "events", "pool")  # partitioned by engine, as an export is
UNNAMED_ENGINE = "unnamed"


@dataclass(frozen=True)
class SegmentPolicy:
    """When the open segment closes (rows, minutes: whichever comes first), where closed
    segments go (None: `RUN.duckdb.segments` beside the head), and how long (days) and how
    much (bytes of Parquet) of them is kept."""

    rows: int | None = None
    minutes: float | None = None
    directory: Path | None = None
    keep_days: float | None = None
    keep_bytes: int | None = None


def default_directory(head: Path) -> Path:
    return head.with_name(head.name + ".segments")


class Segments:
    """The segments of the run a `RunStore` writes: closes the open one when due."""

    def __init__(
        self,
        store: RunStore,
        policy: SegmentPolicy,
        live_copy: LiveCopy | None = None,
        log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
    ) -> None:
        self._store = store
        self._policy = policy
        self._live_copy = live_copy
        self._log = log
        row = store.row("SELECT run_id FROM runs")
        self.run_id = str(row[0]) if row else ""
        meta = dict(store.rows("SELECT key, value FROM meta"))
        given = policy.directory or default_directory(store.path)
        self.directory = Path(meta.get(DIR_KEY, str(given.resolve())))
        self.first = int(meta.get(FIRST_KEY, 0))
        self.next = int(meta.get(NEXT_KEY, 0))
        if DIR_KEY not in meta:
            self._set_meta({DIR_KEY: str(self.directory), FIRST_KEY: "0", NEXT_KEY: "0"})
        self._remove_unclosed()
        self._rows_at_open = store.num_rows
        self._opened_at = time.monotonic()

    def due(self) -> bool:
        """Whether the open segment holds enough rows, or is old enough, to close."""
        rows = self._store.num_rows - self._rows_at_open
        policy = self._policy
        if rows <= 0:
            return False
        if policy.rows is not None and rows >= policy.rows:
            return True
        age_s = time.monotonic() - self._opened_at
        return policy.minutes is not None and age_s >= policy.minutes * 60

    def close_if_due(self) -> None:
        """Close the open segment if it is due. A segment that cannot be written (a full
        disk) stays open, its rows in the head, and is tried again after as many rows more."""
        if not self.due():
            return
        try:
            self.close()
        except (OSError, duckdb.Error, StoreError) as error:
            shutil.rmtree(self.directory / f".closing-{segment_stem(self.run_id, self.next)}", True)
            self._rows_at_open = self._store.num_rows
            self._opened_at = time.monotonic()
            self._log(f"kvscope collect: segment {self.next} not closed, its rows stay: {error}")

    def close(self) -> None:
        """Close the open segment: its rows to Parquet, then out of the head; then drop what
        retention no longer keeps."""
        if self._live_copy is not None:
            self._live_copy.start_over()  # no copy reads the head while rows leave it
        store = self._store
        store.refresh_derived()  # flushed, and every eviction's age filled
        number = self.next
        stem = segment_stem(self.run_id, number)
        temporary = self.directory / f".closing-{stem}"
        shutil.rmtree(temporary, ignore_errors=True)
        temporary.mkdir(parents=True)
        closed_at = datetime.now(UTC).replace(tzinfo=None)
        for table in RECORD_TABLES:
            self._write_table(table, temporary, stem, closed_at)
        self._derive(number, temporary, stem)
        files = sorted(temporary.rglob("*.parquet"))
        listed = {file.relative_to(temporary).as_posix(): _entry(store, file) for file in files}
        for name, entry in listed.items():
            entry["table"] = name.split("/")[0]
        for file in files:
            target = self.directory / file.relative_to(temporary)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(file, target)
        shutil.rmtree(temporary)
        manifest = {"run_id": self.run_id, "segment": number, "closed_at": closed_at.isoformat()}
        _write_json(self.directory / MANIFESTS / f"{stem}.json", {**manifest, "files": listed})
        self._in_one_transaction(
            [f"DELETE FROM {table}" for table in RECORD_TABLES], {NEXT_KEY: str(number + 1)}
        )
        store.checkpoint()  # the deleted rows' row groups go: row ids start again
        store.rows_removed()
        self.next = number + 1
        self._rows_at_open = store.num_rows
        self._opened_at = time.monotonic()
        rows = sum(entry["rows"] for entry in listed.values() if entry["table"] == "events")
        self._log(f"kvscope collect: segment {number} closed: {rows:,} event rows, {stem}")
        if self._policy.keep_days is not None:
            self.drop_older_than(closed_at - timedelta(days=self._policy.keep_days))
        if self._policy.keep_bytes is not None:
            self.drop_beyond(self._policy.keep_bytes)

    def _derive(self, number: int, temporary: Path, stem: str) -> None:
        """Derive the segment's cache lifetimes beside its files (segment_lifetimes.py), on
        from the state the segment before left: none for the run's first segment or one
        after a segment retention dropped; nothing where the segment before has none (closed
        by an older kvscope, or out of order): readers then derive the run from its rows."""
        before = self._manifest(number - 1) if number > self.first else {}
        state = [name for name, entry in before.get("files", {}).items()
                 if entry["table"] == CARRIED]  # fmt: skip
        if before and not state:
            return
        path = str(self.directory / state[0]) if state else None
        write_segment(self._store.row, number, path, temporary, stem)

    def drop_older_than(self, cutoff: datetime) -> None:
        """Drop the closed segments closed before `cutoff` (UTC)."""
        manifests = [self._manifest(number) for number in range(self.first, self.next)]
        old = [m for m in manifests if m and datetime.fromisoformat(m["closed_at"]) < cutoff]
        days = f"--keep {self._policy.keep_days:g} days"
        self._drop(old, f"closed before {cutoff.isoformat(timespec='seconds')} ({days})")

    def drop_beyond(self, limit: int) -> None:
        """Drop the oldest closed segments until those kept hold at most `limit` bytes."""
        manifests = [self._manifest(number) for number in range(self.first, self.next)]
        manifests = [manifest for manifest in manifests if manifest]
        held = sum(_bytes(manifest) for manifest in manifests)
        old = []
        for manifest in manifests:
            if held <= limit:
                break
            old.append(manifest)
            held -= _bytes(manifest)
        self._drop(old, f"beyond {limit:,} bytes of closed segments (--keep-size)")

    def _drop(self, old: list[dict[str, Any]], why: str) -> None:
        """Drop the closed segments `old` (the oldest kept, in order): the head stops
        counting them first, then their manifests and files go."""
        if not old:
            return
        first = max(int(m["segment"]) for m in old) + 1
        rows = sum(e["rows"] for m in old for e in m["files"].values() if e["table"] == "events")
        note = (
            f"segments {self.first} to {first - 1} dropped at "
            f"{datetime.now(UTC).replace(tzinfo=None).isoformat(timespec='seconds')}: "
            f"{rows:,} event rows {why}"
        )
        meta = {FIRST_KEY: str(first), RETENTION_KEY: note}
        origin = self._first_record_ns(old)
        if origin is not None:
            meta[ORIGIN_KEY] = str(origin)
        self._in_one_transaction([], meta)
        self._store.checkpoint()
        for manifest in old:
            self._remove_segment(int(manifest["segment"]), manifest)
        self.first = first
        self._log(f"kvscope collect: retention: {note}")

    def _first_record_ns(self, old: list[dict[str, Any]]) -> int | None:
        """The time of the run's first record: the oldest of the one an earlier drop kept and
        the records of the segments `old`, about to be dropped."""
        kept = self._store.row("SELECT value FROM meta WHERE key = ?", [ORIGIN_KEY])
        times = [int(kept[0])] if kept else []
        files = [
            self.directory / name
            for manifest in old
            for name, entry in manifest["files"].items()
            if entry["table"] in ENGINE_TABLES and (self.directory / name).is_file()
        ]
        if files:
            listed = ", ".join(path_literal(file) for file in files)
            row = self._store.row(
                f"SELECT min(ts_ns) FROM read_parquet([{listed}], union_by_name = true)"
            )
            if row and row[0] is not None:
                times.append(int(row[0]))
        return min(times, default=None)

    def _write_table(self, table: str, temporary: Path, stem: str, closed_at: datetime) -> None:
        store = self._store
        counted = store.row(f"SELECT count(*) FROM {table}")
        if not counted or not counted[0]:
            return
        target = temporary / table
        if table in ENGINE_TABLES:
            store.row(
                f"COPY (SELECT *, coalesce(nullif(engine_id, ''), '{UNNAMED_ENGINE}') AS engine, "
                f"DATE '{closed_at.date()}' AS date FROM {table}) TO {path_literal(target)} "
                f"(FORMAT PARQUET, PARTITION_BY (engine, date), FILENAME_PATTERN '{stem}_{{i}}')"
            )
        else:
            target.mkdir()
            store.row(
                f"COPY {table} TO {path_literal(target / f'{stem}.parquet')} (FORMAT PARQUET)"
            )

    def _manifest(self, number: int) -> dict[str, Any]:
        path = self.directory / MANIFESTS / f"{segment_stem(self.run_id, number)}.json"
        try:
            manifest: dict[str, Any] = json.loads(path.read_text())
        except FileNotFoundError:
            return {}  # removed by hand: nothing left to drop
        except (OSError, ValueError) as error:
            raise StoreError(
                f"{path}: a closed segment's manifest cannot be read: {error}"
            ) from None
        return manifest

    def _remove_segment(self, number: int, manifest: dict[str, Any] | None) -> None:
        stem = segment_stem(self.run_id, number)
        (self.directory / MANIFESTS / f"{stem}.json").unlink(missing_ok=True)
        named = [self.directory / name for name in (manifest or {}).get("files", {})]
        found = [
            *self.directory.glob(f"*/**/{stem}_*.parquet"),
            *self.directory.glob(f"*/{stem}.parquet"),
        ]
        for file in {*named, *found}:
            file.unlink(missing_ok=True)

    def _remove_unclosed(self) -> None:
        """What a collector killed while closing a segment left: its temporary folder, and
        the files of a segment the head does not count as closed."""
        if not self.directory.is_dir():
            return
        for folder in self.directory.glob(f".closing-{self.run_id}-*"):
            shutil.rmtree(folder, ignore_errors=True)
        self._remove_segment(self.next, None)
        for manifest in (self.directory / MANIFESTS).glob(f"{self.run_id}-*.json"):
            number = manifest.stem.rsplit("-", 1)[-1]
            if number.isdigit() and int(number) < self.first:  # retention killed midway
                self._remove_segment(int(number), None)

    def _set_meta(self, values: dict[str, str]) -> None:
        self._in_one_transaction([], values)

    def _in_one_transaction(self, statements: list[str], meta: dict[str, str]) -> None:
        """Run `statements` and set `meta`'s keys in the head in one transaction."""
        store = self._store
        store.row("BEGIN TRANSACTION")
        try:
            for statement in statements:
                store.row(statement)
            for key, value in meta.items():
                store.row("INSERT OR REPLACE INTO meta VALUES (?, ?)", [key, value])
        except BaseException:
            store.row("ROLLBACK")
            raise
        store.row("COMMIT")


def _entry(store: RunStore, file: Path) -> dict[str, Any]:
    """A closed segment's file as its manifest lists it."""
    row = store.row(f"SELECT num_rows FROM parquet_file_metadata({path_literal(file)})")
    with file.open("rb") as handle:
        digest = hashlib.file_digest(handle, "blake2b").hexdigest()
    return {"bytes": file.stat().st_size, "rows": int(row[0]) if row else 0, "blake2b": digest}


def _bytes(manifest: dict[str, Any]) -> int:
    """The bytes of a closed segment's files."""
    return sum(int(entry["bytes"]) for entry in manifest["files"].values())


def _write_json(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(value, indent=1) + "\n")
    os.replace(temporary, path)
