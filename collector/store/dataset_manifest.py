"""The manifest of a run exported as a Parquet dataset: what the export wrote, so that a file
lost, cut short, damaged or added later shows when the dataset is opened.

`DIR/manifests/<run>.json`, one per run exported into the folder (several exports copied into
one folder keep one each), lists every Parquet file the export wrote, relative to `DIR`: its
bytes, its rows and a BLAKE2b digest of its bytes. Opening a dataset (`check_dataset`) finds
every listed file with its bytes and rows (sizes and Parquet footers: cheap at any size), and
no Parquet file under a table's folder that no manifest lists; when the listed files hold at
most integrity.FULL_CHECK_BYTES together, their digests too (a damaged page of a Parquet file
reads as other values, without an error). A dataset of format 1, exported before there were
manifests, gets its runs and meta tables' files checked for.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import duckdb

from collector.store.integrity import FULL_CHECK_BYTES
from collector.store.sql_literal import path_literal

MANIFESTS = "manifests"
REQUIRED_TABLES = ("meta", "runs")  # what even an empty run's export holds


def write_manifest(directory: Path, tables: Iterable[str], run: str) -> None:
    """List the Parquet files of `tables` under `directory` in the manifest of `run`."""
    files = sorted(file for table in tables for file in (directory / table).rglob("*.parquet"))
    rows = _rows(files)
    listed = {
        file.relative_to(directory).as_posix(): {
            "bytes": file.stat().st_size,
            "rows": rows[file],
            "blake2b": _digest(file),
        }
        for file in files
    }
    (directory / MANIFESTS).mkdir()
    manifest = {"run_id": run, "files": listed}
    (directory / MANIFESTS / f"{run}.json").write_text(json.dumps(manifest, indent=1) + "\n")


def check_dataset(directory: Path, tables: Iterable[str], version: int) -> str | None:
    """What is wrong with the dataset in `directory` (of dataset format `version`), if
    anything."""
    present = {
        file.relative_to(directory).as_posix()
        for table in tables
        for file in (directory / table).rglob("*.parquet")
    }
    if version < 2:
        for table in REQUIRED_TABLES:
            if not any(name.startswith(f"{table}/") for name in present):
                return f"{table}: no Parquet file, and every run holds that table"
        return None
    listed, problem = _listed(directory)
    if problem:
        return problem
    strays = sorted(present - set(listed))
    if strays:
        return f"{strays[0]}: a Parquet file no manifest lists (added after the export?)"
    for name, (manifest, entry) in sorted(listed.items()):
        path = directory / name
        if not path.is_file():
            return f"{name}: missing (listed in {manifest})"
        if path.stat().st_size != entry["bytes"]:
            return (
                f"{name}: {path.stat().st_size:,} bytes where {manifest} lists "
                f"{entry['bytes']:,} (cut short, or another file)"
            )
    files = [directory / name for name in sorted(listed)]
    try:
        rows = _rows(files)
    except duckdb.Error as error:
        return f"a Parquet file cannot be read: {str(error).splitlines()[0]}"
    for name, (manifest, entry) in sorted(listed.items()):
        if rows[directory / name] != entry["rows"]:
            return (
                f"{name}: {rows[directory / name]:,} rows where {manifest} lists {entry['rows']:,}"
            )
    if sum(entry["bytes"] for _, entry in listed.values()) <= FULL_CHECK_BYTES:
        for name, (manifest, entry) in sorted(listed.items()):
            if _digest(directory / name) != entry["blake2b"]:
                return f"{name}: its bytes differ from those {manifest} lists (damaged)"
    return None


def _listed(directory: Path) -> tuple[dict[str, tuple[str, Mapping[str, Any]]], str | None]:
    """Every file the manifests list, with the manifest listing it; or what is wrong with
    them."""
    manifests = sorted((directory / MANIFESTS).glob("*.json"))
    if not manifests:
        return {}, f"{MANIFESTS}/: no manifest of the runs exported here"
    listed: dict[str, tuple[str, Mapping[str, Any]]] = {}
    for path in manifests:
        name = path.relative_to(directory).as_posix()
        try:
            files = json.loads(path.read_text())["files"]
            for file, entry in files.items():
                listed[file] = (
                    name,
                    {
                        "bytes": int(entry["bytes"]),
                        "rows": int(entry["rows"]),
                        "blake2b": str(entry["blake2b"]),
                    },
                )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            return {}, f"{name}: cannot be read ({type(error).__name__}: {error})"
        if not any(file.startswith("runs/") for file in files):
            return {}, f"{name}: lists no file of the runs table"
    return listed, None


def _rows(files: list[Path]) -> dict[Path, int]:
    """Each Parquet file's rows, from its footer."""
    if not files:
        return {}
    names = ", ".join(path_literal(file) for file in files)
    with duckdb.connect() as connection:
        connection.execute("SET autoinstall_known_extensions = false")
        connection.execute("SET autoload_known_extensions = false")
        found = dict(
            connection.execute(
                f"SELECT file_name, num_rows FROM parquet_file_metadata([{names}])"
            ).fetchall()
        )
    return {file: int(found[str(file)]) for file in files}


def _digest(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "blake2b").hexdigest()
