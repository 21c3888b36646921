"""What a DuckDB file says of its own schema (its version, its tables), read without the
checks opening a run makes: for a command that must tell a run made before one of its tables
existed from a damaged one, once opening has refused it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb

from collector.store.run_opening import DUCKDB_MAGIC, connect


@dataclass(frozen=True)
class RecordedSchema:
    """A run file's `meta` schema version (None: none recorded) and its tables."""

    version: int | None
    tables: frozenset[str]


def recorded_schema(path: Path) -> RecordedSchema | None:
    """The schema a DuckDB file records, or None when it is no DuckDB file that opens (a
    folder, missing, another kind of file, damaged) or records no kvscope `meta` table."""
    try:
        with path.open("rb") as handle:
            if handle.read(12)[8:] != DUCKDB_MAGIC:
                return None
    except OSError:  # missing, a folder, unreadable
        return None
    try:
        connection = connect(path, read_only=True)
    except duckdb.Error:
        return None
    try:
        tables = frozenset(
            name
            for (name,) in connection.execute(
                "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()"
            ).fetchall()
        )
        if "meta" not in tables:
            return None
        row = connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except duckdb.Error:
        return None
    finally:
        connection.close()
    version = int(row[0]) if row is not None and str(row[0]).isdigit() else None
    return RecordedSchema(version, tables)
