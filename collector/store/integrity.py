"""Whether a run file is whole: the checks `RunFile.open` makes before a query reads it, and
the record of what a run holds that `RunStore.finalize` writes for them.

A DuckDB file is a main header and two database headers of 4 KiB each (the one of the higher
iteration is in use: it names the blocks of the last checkpoint), then blocks of 256 KiB.
Each header and each block begins with an 8-byte checksum of the rest of it (`checksums`).
DuckDB verifies a block's checksum only when a query reads the block, so a damaged block no
query of a command read went unseen, and a file cut short by less than a block read as a
whole run. So, cheapest first:

1. `layout_problem`: the headers match their checksums, and the file holds whole blocks, as
   many as are in use (a file cut at a block's edge with as many free blocks left inside
   it passes: DuckDB refuses the first query reading past its end, refused as in 3);
2. `contents_problem`: every table of a run is there, with one runs row whose settings can
   be (a block size of at least one token, a pool of no fewer than zero blocks:
   `settings_problem`, which datasets are held to too); a finished run's tables hold the
   rows its record says (`record_contents`, meta key CONTENTS_KEY; DuckDB counts a table's
   rows from its metadata, so at any size this costs milliseconds);
3. every block a table or the catalog uses matches its checksum, read once with numpy (1.0
   to 1.3 GB/s on this 2-core machine), when the file holds at most FULL_CHECK_BYTES. A
   larger file (a run of 100 million records is 4.4 GiB) is checked by DuckDB as queries
   read it, and `RunFile` turns a damaged block met there into the same one-line refusal.

DuckDB's checksum xors the products of a block's 8-byte words with a constant, so damage
that writes an even number of equal words over equal words (64 zero bytes turned to 0xFF)
cancels out in it: neither DuckDB nor these checks see that.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from pathlib import Path

import duckdb
import numpy as np

HEADER_BYTES = 4096
HEADERS = 3  # the main header and the two database headers
FULL_CHECK_BYTES = 512 << 20  # about half a second of reading at most
CONTENTS_KEY = "contents"
_CHECKSUM_FACTOR = np.uint64(0xBF58476D1CE4E5B9)
_CHECKSUM_SEED = np.uint64(5381)
_READ_BLOCKS = 64  # blocks read and summed at once: 16 MiB
_BLOCK_ID = (1 << 56) - 1  # a metadata pointer: its block, below the sub-block's index
_NO_BLOCK = (1 << 64) - 1


def checksums(blocks: np.ndarray) -> np.ndarray:
    """DuckDB's checksum of each row of `blocks` (little-endian 64-bit words, the stored
    checksum first): 5381 xor-ed with each following word times a constant
    (duckdb/src/common/checksum.cpp; every header and block holds a whole number of words)."""
    summed: np.ndarray = np.bitwise_xor.reduce(blocks[:, 1:] * _CHECKSUM_FACTOR, axis=1)
    return summed ^ _CHECKSUM_SEED


def _words(data: bytes, count: int) -> np.ndarray:
    return np.frombuffer(data, dtype="<u8", count=count * (len(data) // count // 8)).reshape(
        count, -1
    )


def layout_problem(path: Path, connection: duckdb.DuckDBPyConnection | None = None) -> str | None:
    """What is wrong with a DuckDB file's headers and length, if anything (12 KiB read). The
    file is open in DuckDB on `connection` meanwhile, so that no writer checkpoints it
    between the two (without one, as DuckDB failed to open it: what the headers tell).

    DuckDB writes its headers and whole blocks, and cuts free blocks off the end of the file
    at a checkpoint (its header still counting them): the file must hold a whole number of
    blocks, as many as are in use and the blocks its header points into."""
    used_blocks = _database_size(connection)[2] if connection is not None else 0
    size = path.stat().st_size
    with path.open("rb") as handle:
        headers = handle.read(HEADERS * HEADER_BYTES)
    if len(headers) < HEADERS * HEADER_BYTES:
        return f"{size:,} bytes, less than DuckDB's headers ({HEADERS * HEADER_BYTES:,}): cut short"
    words = _words(headers, HEADERS)
    matches = words[:, 0] == checksums(words)
    if not matches[0]:
        return "its main header does not match its checksum"
    in_use = 1 + int(np.argmax(words[1:, 1]))  # the database header of the higher iteration
    if not matches[in_use]:
        return "its database header in use does not match its checksum"
    catalog, free_list, _, block_bytes = (int(value) for value in words[in_use, 2:6])
    if block_bytes < HEADER_BYTES or block_bytes % HEADER_BYTES:
        return f"its database header gives blocks of {block_bytes:,} bytes"
    blocks, rest = divmod(size - HEADERS * HEADER_BYTES, block_bytes)
    if rest:
        return (
            f"{size:,} bytes, not DuckDB's headers and whole blocks of {block_bytes:,} bytes: "
            "cut short (or bytes added)"
        )
    pointed = [pointer & _BLOCK_ID for pointer in (catalog, free_list) if pointer != _NO_BLOCK]
    needed = max([used_blocks, *(block + 1 for block in pointed)])
    if blocks < needed:
        return f"{blocks:,} blocks of {block_bytes:,} bytes where {needed:,} are in use: cut short"
    return None


def contents_problem(
    connection: duckdb.DuckDBPyConnection, path: Path, tables: Collection[str]
) -> str | None:
    """What is wrong with an open run file of the right schema version, which must hold
    `tables`, if anything."""
    missing = sorted(set(tables) - set(_tables(connection)))
    if missing:
        return f"tables missing: {', '.join(missing)}"
    problem = settings_problem(connection)
    if problem:
        return problem
    row = connection.execute("SELECT finished_at IS NOT NULL FROM runs").fetchone()
    if row and row[0]:
        problem = _record_problem(connection)
        if problem:
            return problem
    if path.stat().st_size <= FULL_CHECK_BYTES:
        return _block_problem(connection, path)
    return None


def settings_problem(connection: duckdb.DuckDBPyConnection) -> str | None:
    """A runs table of other than one row, or settings no cache has."""
    rows = connection.execute("SELECT block_size, num_blocks FROM runs").fetchall()
    if len(rows) != 1:
        return f"{len(rows)} rows in its runs table, a run has one"
    block_size, num_blocks = rows[0]
    if block_size is None or block_size < 1:
        return f"its runs row gives block size {block_size} (a block holds 1 token or more)"
    if num_blocks is None or num_blocks < 0:
        return f"its runs row gives a pool of {num_blocks} blocks (0 or more)"
    return None


def record_contents(connection: duckdb.DuckDBPyConnection) -> None:
    """Record each table's rows in the run's meta table (key CONTENTS_KEY), as it ends (but
    for meta's own, which holds the record)."""
    counts = {table: _count(connection, table) for table in _tables(connection) if table != "meta"}
    connection.execute(
        "INSERT OR REPLACE INTO meta VALUES (?, ?)",
        [CONTENTS_KEY, json.dumps(counts, sort_keys=True)],
    )


def _tables(connection: duckdb.DuckDBPyConnection) -> list[str]:
    rows = connection.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "ORDER BY table_name"
    ).fetchall()
    return [name for (name,) in rows]


def _count(connection: duckdb.DuckDBPyConnection, table: str) -> int:
    row = connection.execute(f'SELECT count(*) FROM "{table}"').fetchone()
    return int(row[0]) if row else 0


def _record_problem(connection: duckdb.DuckDBPyConnection) -> str | None:
    """A table whose rows differ from the run's record of them (none for a run finished
    before kvscope kept one)."""
    row = connection.execute("SELECT value FROM meta WHERE key = ?", [CONTENTS_KEY]).fetchone()
    if row is None:
        return None
    try:
        recorded = json.loads(row[0])
        counts = {str(table): int(count) for table, count in recorded.items()}
    except (ValueError, TypeError, AttributeError):
        return f"its record of what it holds (meta {CONTENTS_KEY}) cannot be read: {row[0]!r}"
    tables = set(_tables(connection))
    for table, count in sorted(counts.items()):
        if table not in tables:
            return f"{table}: no such table where the run recorded {count:,} rows"
        actual = _count(connection, table)
        if actual != count:
            return f"{table}: {actual:,} rows where the run recorded {count:,} at its end"
    return None


def _block_problem(connection: duckdb.DuckDBPyConnection, path: Path) -> str | None:
    """The first block a table or the catalog uses that does not match its checksum. Every
    block the file holds is read (a free one holds what it held last, checksum and all);
    only when one does not match are the blocks in use looked up (`pragma_storage_info`
    takes longer than the reading): damage in a free block is none in the run."""
    block_bytes, block_count, _ = _database_size(connection)
    present = (path.stat().st_size - HEADERS * HEADER_BYTES) // block_bytes
    bad = _damaged_blocks(path, min(block_count, present), block_bytes)
    if not bad:
        return None
    owners = _block_owners(connection)
    bad = [block for block in bad if block in owners]
    if not bad:
        return None
    more = f" (and {len(bad) - 1:,} more)" * (len(bad) > 1)
    return f"block {bad[0]:,} ({owners[bad[0]]}) does not match its checksum{more}"


def _block_owners(connection: duckdb.DuckDBPyConnection) -> dict[int, str]:
    """Every block in use by a table or the catalog, and what it holds."""
    owners = {
        int(block): "the catalog"
        for (block,) in connection.execute("SELECT block_id FROM pragma_metadata_info()").fetchall()
    }
    for table in _tables(connection):
        rows = connection.execute(
            "SELECT DISTINCT block_id, additional_block_ids FROM pragma_storage_info(?) "
            "WHERE persistent AND block_id >= 0",
            [table],
        ).fetchall()
        for block, extra in rows:
            for number in (block, *(extra or ())):
                owners.setdefault(int(number), f"table {table}")
    return owners


def _database_size(connection: duckdb.DuckDBPyConnection) -> tuple[int, int, int]:
    """The open file's block size, the blocks its header counts, and those in use."""
    row = connection.execute(
        "SELECT block_size, total_blocks, used_blocks FROM pragma_database_size() "
        "WHERE database_name = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def _damaged_blocks(path: Path, count: int, block_bytes: int) -> list[int]:
    """The blocks of the first `count` whose checksum does not match."""
    bad: list[int] = []
    descriptor = os.open(path, os.O_RDONLY)
    try:
        for first in range(0, count, _READ_BLOCKS):
            number = min(_READ_BLOCKS, count - first)
            data = os.pread(descriptor, number * block_bytes, _offset(first, block_bytes))
            words = _words(data, number)
            bad += [first + int(i) for i in np.flatnonzero(words[:, 0] != checksums(words))]
    finally:
        os.close(descriptor)
    return bad


def _offset(block: int, block_bytes: int) -> int:
    return HEADERS * HEADER_BYTES + block * block_bytes


def damage_met(error: duckdb.Error) -> bool:
    """Whether DuckDB refused a query for damage in what it read: a block of a run file that
    does not match its checksum, a file it could not read."""
    return "Corrupt database file" in str(error) or isinstance(error, duckdb.IOException)
