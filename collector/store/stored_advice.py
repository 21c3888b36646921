"""The advisor's result kept in the run file itself (meta key ADVICE_KEY, one JSON document),
and the digest of the run's content it is checked against (collector/advisor/stored.py).

The digest is of what the run holds, not of its file's bytes: writing the advice into the
file changes its bytes but not its content. It is each run table's rows (all but meta's) as
DuckDB counts and hashes them (the sum of every row's hash, so row order does not count),
and meta's rows but the advice itself and the names users gave families, with DuckDB's
version (its hash is its own). On this 2-core machine it costs about 50 ms on the 9 MiB
sample run: DuckDB reads every column once.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import duckdb

from collector.store.given_names import GIVEN_NAMES_KEY
from collector.store.meta_entry import write_meta_entry
from collector.store.parquet_dataset import is_dataset
from collector.store.run_file import RUN_TABLES, RunFile

ADVICE_KEY = "advice"


def content_digest(run: RunFile) -> str:
    """A digest of every row the run holds, the stored advice aside."""
    digest = hashlib.blake2b(duckdb.__version__.encode(), digest_size=16)
    for table in sorted(RUN_TABLES - {"meta"}):  # a dataset's tables are views: named
        row = run.row(f'SELECT count(*), sum(hash(t))::VARCHAR FROM "{table}" AS t')
        digest.update(f"\0{table}\0{row}".encode())
    for key, value in run.rows(
        "SELECT key, value FROM meta WHERE key NOT IN (?, ?) ORDER BY key",
        [ADVICE_KEY, GIVEN_NAMES_KEY],  # names a user gives families change no figure
    ):
        digest.update(f"\0{key}\0{value}".encode())
    return digest.hexdigest()


def read_advice(run: RunFile) -> str | None:
    """The advice kept in the run (a JSON document), or None: none kept, or a dataset."""
    if is_dataset(run.path):
        return None
    row = run.row("SELECT value FROM meta WHERE key = ?", [ADVICE_KEY])
    return str(row[0]) if row else None


def write_advice(path: Path, document: str) -> str | None:
    """Keep `document` in the run file at `path` (no connection to it may be open in this
    process); None when kept, else why not, in words (a dataset, a read-only file, a file
    another process holds)."""
    return write_meta_entry(path, ADVICE_KEY, lambda _: document)
