"""Damaged run files and Parquet datasets, made from the committed sample run: each case
names how it damages a copy and what the refusal must say.

DuckDB's file: a 4 KiB main header, two 4 KiB database headers (the newer one is in use),
then blocks of 256 KiB, each starting with the 8-byte checksum of the rest of it."""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np

from collector.store.integrity import checksums, record_contents
from collector.store.parquet_dataset import DATASET_MARKER
from collector.store.parquet_export import export_parquet
from collector.store.run_file import RunFile
from tests.support.repo import SAMPLE_RUN

HEADERS_BYTES = 3 * 4096
BLOCK_BYTES = 256 * 1024


@dataclass(frozen=True)
class Damage:
    """How a copy of the sample is damaged, and what the one-line refusal says."""

    make: Callable[[Path], None]
    reason: str
    dataset: bool = False  # `make` gets a folder holding the sample exported as a dataset


def table_block(table: str) -> int:
    """The first block holding `table`'s rows in the sample run."""
    with duckdb.connect(str(SAMPLE_RUN), read_only=True) as connection:
        row = connection.execute(
            "SELECT min(block_id) FROM pragma_storage_info(?) WHERE persistent AND block_id >= 0",
            [table],
        ).fetchone()
    assert row is not None and row[0] is not None, table
    return int(row[0])


def _overwrite(path: Path, offset: int, data: bytes) -> None:
    with path.open("r+b") as handle:
        handle.seek(offset)
        old = handle.read(len(data))
        assert old != data, "the damage changes the bytes"
        handle.seek(offset)
        handle.write(data)


def scribbled_block(
    table: str | None, block: int = 0, zeroed: bool = False
) -> Callable[[Path], None]:
    """The sample with a 512-byte sector in the middle of a block overwritten with other
    bytes (`zeroed`: the whole block zeroes, as a lost page reads back): the block `table`'s
    rows start in, else `block`. (DuckDB's checksum xors the products of the block's 8-byte
    words, so damage writing an even number of equal words over equal words, say 64 zero
    bytes turned to 0xFF, cancels out in it: the sector here is random bytes.)"""

    def damage(path: Path) -> None:
        shutil.copy(SAMPLE_RUN, path)
        number = table_block(table) if table else block
        start = HEADERS_BYTES + number * BLOCK_BYTES
        if zeroed:
            _overwrite(path, start, bytes(BLOCK_BYTES))
        else:
            _overwrite(path, start + BLOCK_BYTES // 2, random.Random(number).randbytes(512))

    return damage


def scribbled_header(path: Path) -> None:
    """The database header in use (the one of the higher iteration) overwritten."""
    shutil.copy(SAMPLE_RUN, path)
    data = path.read_bytes()
    iterations = [
        int.from_bytes(data[offset + 8 : offset + 16], "little") for offset in (4096, 8192)
    ]
    offset = 4096 if iterations[0] > iterations[1] else 8192
    _overwrite(path, offset + 16, b"\xa5" * 32)


def forged_block_size(path: Path) -> None:
    """Both database headers giving blocks of 0 bytes, their checksums made to match."""

    shutil.copy(SAMPLE_RUN, path)
    data = bytearray(path.read_bytes())
    for offset in (4096, 8192):
        words = np.frombuffer(bytes(data[offset : offset + 4096]), dtype="<u8").copy()
        words[5] = 0  # after the checksum, iteration, catalog, free list and block count
        words[0] = checksums(words.reshape(1, -1))[0]
        data[offset : offset + 4096] = words.tobytes()
    path.write_bytes(bytes(data))


def _blocks() -> tuple[int, int]:
    """The sample's blocks: those its header counts, and those in use."""
    with duckdb.connect(str(SAMPLE_RUN), read_only=True) as connection:
        row = connection.execute(
            "SELECT total_blocks, used_blocks FROM pragma_database_size()"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def used_blocks() -> int:
    return _blocks()[1]


def free_blocks() -> int:
    """The sample's free blocks: cutting as many off its end leaves a whole run (DuckDB
    refuses only a query reading past the end)."""
    total, used = _blocks()
    return total - used


def cut_by(count: int) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        data = SAMPLE_RUN.read_bytes()
        path.write_bytes(data[: len(data) - count])

    return damage


def grown_by(count: int) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        path.write_bytes(SAMPLE_RUN.read_bytes() + os.urandom(count))

    return damage


def cut_to(count: int) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        path.write_bytes(SAMPLE_RUN.read_bytes()[:count])

    return damage


def sqlite_file(path: Path) -> None:
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE t (x)")


def foreign_duckdb(path: Path) -> None:
    with duckdb.connect(str(path)) as connection:
        connection.execute("CREATE TABLE t (x INTEGER)")


def sample_with(*statements: str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        shutil.copy(SAMPLE_RUN, path)
        with duckdb.connect(str(path)) as connection:
            for statement in statements:
                connection.execute(statement)

    return damage


def recorded_then(*statements: str) -> Callable[[Path], None]:
    """The sample with the record of what it holds that `finalize` writes, then changed."""

    def damage(path: Path) -> None:

        shutil.copy(SAMPLE_RUN, path)
        with duckdb.connect(str(path)) as connection:
            record_contents(connection)
            for statement in statements:
                connection.execute(statement)

    return damage


# Datasets: `make` gets the sample exported under the folder it is given.
def _files(directory: Path, table: str) -> list[Path]:
    files = sorted((directory / table).rglob("*.parquet"))
    assert files, table
    return files


def without_table(table: str) -> Callable[[Path], None]:
    def damage(directory: Path) -> None:
        for file in _files(directory, table):
            file.unlink()

    return damage


def parquet_cut(directory: Path) -> None:
    file = _files(directory, "events")[0]
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


def parquet_scribbled(directory: Path) -> None:
    file = _files(directory, "events")[0]
    _overwrite(file, file.stat().st_size // 2, random.Random(1).randbytes(64))


def parquet_replaced(directory: Path) -> None:
    """The runs table's file replaced by a well-formed one of another run."""
    file = _files(directory, "runs")[0]
    with duckdb.connect() as connection:
        connection.execute(
            f"COPY (SELECT * REPLACE ('other' AS run_id) FROM read_parquet('{file}')) "
            f"TO '{file}.new' (FORMAT PARQUET)"
        )
    os.replace(f"{file}.new", file)


def marker_damaged(directory: Path) -> None:
    (directory / DATASET_MARKER).write_text('{"format": 2, "schema_ver')


def stray_parquet(directory: Path) -> None:
    """A Parquet file no export listed, beside the export's own."""
    first = _files(directory, "events")[0]
    shutil.copy(first, first.with_name("stray_0.parquet"))


RUN_FILE_DAMAGE: dict[str, Damage] = {
    "empty": Damage(lambda path: path.write_bytes(b""), "not a DuckDB file"),
    "random bytes": Damage(lambda path: path.write_bytes(os.urandom(50_000)), "not a DuckDB file"),
    "sqlite": Damage(sqlite_file, "not a DuckDB file"),
    "headers only": Damage(cut_to(HEADERS_BYTES), "cut short"),
    "cut in half": Damage(cut_by(SAMPLE_RUN.stat().st_size // 2), "cut short"),
    "cut by 4 KiB": Damage(cut_by(4096), "cut short"),
    "cut by 1 byte": Damage(cut_by(1), "cut short"),
    "cut into the blocks in use": Damage(
        cut_by((1 + free_blocks()) * BLOCK_BYTES), f"{used_blocks()} are in use: cut short"
    ),
    "4 KiB added": Damage(grown_by(4096), "bytes added"),
    "database header damaged": Damage(scribbled_header, "damaged"),
    "header forged: blocks of 0 bytes": Damage(forged_block_size, "blocks of 0 bytes"),
    "catalog block damaged": Damage(scribbled_block(None, block=0), "damaged"),
    "meta block damaged": Damage(scribbled_block("meta"), "checksum"),
    "runs block damaged": Damage(scribbled_block("runs"), "checksum"),
    "events block damaged": Damage(scribbled_block("events"), "checksum"),
    "events block zeroed": Damage(scribbled_block("events", zeroed=True), "checksum"),
    "rollup block damaged": Damage(scribbled_block("time_rollup"), "checksum"),
    "requests block damaged": Damage(scribbled_block("requests"), "checksum"),
    "foreign duckdb": Damage(foreign_duckdb, "not a kvscope run"),
    "no events table": Damage(sample_with("DROP TABLE events"), "tables missing: events"),
    "no runs row": Damage(sample_with("DELETE FROM runs"), "0 rows in its runs table"),
    "two runs rows": Damage(
        sample_with("INSERT INTO runs SELECT * FROM runs"), "2 rows in its runs table"
    ),
    "another version": Damage(sample_with("UPDATE meta SET value = '99'"), "schema version 99"),
    "block size 0": Damage(sample_with("UPDATE runs SET block_size = 0"), "block size 0"),
    "negative pool": Damage(sample_with("UPDATE runs SET num_blocks = -5"), "-5 blocks"),
    "events deleted after finishing": Damage(
        recorded_then("DELETE FROM events WHERE seq % 7 = 0", "CHECKPOINT"),
        "events: 87,963 rows where the run recorded 101,927",
    ),
    "requests emptied after finishing": Damage(
        recorded_then("DELETE FROM requests", "CHECKPOINT"),
        "requests: 0 rows where the run recorded 500",
    ),
    "record of contents damaged": Damage(
        recorded_then("UPDATE meta SET value = '{\"events\": ' WHERE key = 'contents'"),
        "its record of what it holds",
    ),
}

DATASET_DAMAGE: dict[str, Damage] = {
    "dataset without its events": Damage(without_table("events"), "events", dataset=True),
    "dataset without its runs table": Damage(without_table("runs"), "runs", dataset=True),
    "dataset without its requests": Damage(without_table("requests"), "requests", dataset=True),
    "dataset Parquet file cut short": Damage(parquet_cut, "events", dataset=True),
    "dataset Parquet file damaged": Damage(parquet_scribbled, "events", dataset=True),
    "dataset Parquet file replaced": Damage(parquet_replaced, "runs", dataset=True),
    "dataset marker damaged": Damage(marker_damaged, DATASET_MARKER, dataset=True),
    "dataset with a stray file": Damage(stray_parquet, "stray_0.parquet", dataset=True),
}

DAMAGE = {**RUN_FILE_DAMAGE, **DATASET_DAMAGE}


def damaged_copy(case: str, folder: Path) -> Path:
    """A damaged copy of the sample in `folder` (a run file, or a dataset's folder)."""
    damage = DAMAGE[case]
    if damage.dataset:
        path = folder / "dataset"
        with RunFile.open(SAMPLE_RUN) as run:
            export_parquet(run, path)
    else:
        path = folder / "run.duckdb"
    damage.make(path)
    return path


def exported_sample(folder: Path) -> Path:
    """The sample exported as a dataset, undamaged."""
    path = folder / "dataset"
    with RunFile.open(SAMPLE_RUN) as run:
        export_parquet(run, path)
    return path
