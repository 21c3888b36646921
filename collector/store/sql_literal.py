"""A path as a SQL string literal, for the statements DuckDB takes no parameters in: ATTACH,
COPY targets and views."""

from __future__ import annotations

from pathlib import Path


def path_literal(path: Path | str) -> str:
    """`path` quoted as a SQL string (its quotes doubled)."""
    return "'" + str(path).replace("'", "''") + "'"
