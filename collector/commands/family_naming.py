"""`kvscope names RUN --family KEY=NAME` (and `--families FILE`): a name for a prefix family
where the run recorded no prompt text to name it by (a family's name: collector/model/
family_names.py). KEY is what the app and `kvscope explain` show of a family: its label
("initech · request rag-80"), a request id (the one that first stored it, or any request
of the family), or its hash (16 hex digits as in hovers and downloads, a unique prefix of 8
or more, or the decimal hash of a CSV download). Kept in the run file, else (a Parquet
dataset, a read-only file, one a live collector holds, or --keep-in user) in the user's file
(collector/store/given_names.py). `--forget KEY` drops a family's name from both. Every name
is checked, and every key found, before any is written: on a bad one nothing is."""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Sized
from pathlib import Path

import pandas as pd

from collector.model.family_names import family_names, name_problem
from collector.queries.family_keys import given_names, request_families, run_families
from collector.queries.request_search import family_roots
from collector.safe_text import shown
from collector.store.given_names import (
    run_names,
    user_names_path,
    write_run_names,
    write_user_names,
)
from collector.store.run_file import RunFile, StoreError

SHORTEST_PREFIX = 8  # hex digits of a hash that may stand for it


class NamingError(ValueError):
    """A key or name that cannot be used, in one line that says which and why."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--family",
        action="append",
        default=[],
        metavar="KEY=NAME",
        help="name a prefix family: KEY is its label as the app shows it, a request id of "
        "it, or its hash (16 hex digits, a unique prefix of 8 or more); repeatable",
    )
    parser.add_argument(
        "--families",
        type=Path,
        metavar="FILE",
        help="a CSV file of KEY,NAME rows, one family each",
    )
    parser.add_argument(
        "--forget",
        action="append",
        default=[],
        metavar="KEY",
        help="forget the name given a family (KEY as for --family, its given name too), in "
        "the run file and the user's file; repeatable",
    )
    parser.add_argument(
        "--keep-in",
        choices=("run", "user"),
        default="run",
        help="where the names are kept: the run file (the default; the user's file "
        f"~/.config/kvscope/{user_names_path().name} where the run cannot be written), or "
        "the user's file, for every run whose block hashes are the same",
    )


def wanted_names(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(where it was given, KEY, NAME) for each name asked for; NamingError on a bad one."""
    wanted = []
    for given in args.family:
        key, equals, name = given.partition("=")
        if not equals or not key.strip():
            raise NamingError(f"--family {shown(given)}: not KEY=NAME")
        wanted.append((f"--family {shown(given)}", key.strip(), name.strip()))
    if args.families is not None:
        wanted.extend(_file_names(args.families))
    for where, _, name in wanted:
        problem = name_problem(name)
        if problem is not None:
            raise NamingError(f"{where}: {problem}")
    return wanted


def _file_names(path: Path) -> list[tuple[str, str, str]]:
    try:
        rows = list(csv.reader(path.read_text(encoding="utf-8").splitlines()))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise NamingError(f"{path}: cannot read: {error}") from error
    wanted = []
    for number, row in enumerate(rows, start=1):
        if not row or not "".join(row).strip():
            continue
        if len(row) != 2 or not row[0].strip():
            raise NamingError(f"{path}: line {number}: not KEY,NAME")
        wanted.append((f"{path}: line {number}", row[0].strip(), row[1].strip()))
    if not wanted:
        raise NamingError(f"{path}: no KEY,NAME rows")
    return wanted


def _hash_matches(key: str, families: list[int]) -> set[int]:
    lowered = key.lower().removeprefix("0x")
    found = set()
    if key.isdigit():
        found |= {family for family in families if str(family) == key}
    if len(lowered) >= SHORTEST_PREFIX and all(c in "0123456789abcdef" for c in lowered):
        found |= {family for family in families if f"{family:016x}".startswith(lowered)}
    return found


def resolve(run: RunFile, wanted: list[tuple[str, str, str]]) -> dict[int, tuple[str, str]]:
    """Each name asked for by the family its key finds (with where it was given);
    NamingError for a key that finds none or several."""
    roots = run_families(run)
    families = [int(family) for family in roots["family"]]
    labels = _labels(run, roots)
    by_label: dict[str, set[int]] = {}
    for family, label in labels.items():
        by_label.setdefault(label, set()).add(family)
    by_request = request_families(run, [key for _, key, _ in wanted])
    for request, family in zip(roots["first_request"], families, strict=True):
        if isinstance(request, str):
            by_request[request] = family
    named: dict[int, tuple[str, str]] = {}
    for where, key, name in wanted:
        found = _hash_matches(key, families) or by_label.get(key, set())
        if not found and key in by_request:
            found = {by_request[key]}
        if not found:
            raise NamingError(
                f"{where}: no prefix family of {run.path.name} is known as {shown(key)} "
                "(its label, a request id of it, or its hash)"
            )
        if len(found) > 1:
            raise NamingError(f"{where}: {shown(key)} is {len(found)} families; give its hash")
        named[found.pop()] = (where, name)
    return named


def _labels(run: RunFile, roots: pd.DataFrame) -> dict[int, str]:
    """Each family's label as a machine with no tokenizer shows it (given names included)."""
    given = given_names(run)
    frame = roots.assign(token_ids=None)
    frame["given_name"] = roots["family"].map(lambda family: given.get(int(family)))
    return family_names(frame, None)


def text_named(run: RunFile, families: list[int]) -> set[int]:
    """The `families` whose prompt text the run recorded: named by it where a tokenizer is."""
    roots = family_roots(run, families)
    return {
        int(family)
        for family, ids in zip(roots["family"], roots["token_ids"], strict=True)
        if isinstance(ids, Sized)
    }


def keep(args: argparse.Namespace, changes: dict[int, str | None], in_run: set[int]) -> str:
    """Make `changes` (a name given, or None: forgotten) where asked (the run file, else the
    user's file; a name is forgotten in both); where, in words. StoreError where they could
    not be made, and before anything is written where the run's own names (`in_run`) are to
    be forgotten from a run that cannot be written."""
    forgets: dict[int, str | None] = {family: None for family, name in changes.items() if not name}
    refused = write_run_names(args.run, changes) if args.keep_in == "run" else "--keep-in user"
    if refused is not None and in_run & set(forgets):
        raise StoreError(f"{args.run}: its own names cannot be forgotten: {refused}")
    if refused is None:
        user, where = forgets, f"in the run file {shown(args.run)}"
    else:
        user, where = changes, f"in {shown(user_names_path())} ({refused})"
    if user and (user != forgets or user_names_path().exists()):
        write_user_names(user)
        if refused is None:
            where += f" and {shown(user_names_path())}"
    return where


def name_families(args: argparse.Namespace) -> int:
    """The `--family`, `--families` and `--forget` part of `kvscope names`."""
    try:
        wanted = wanted_names(args)
        forgotten = [(f"--forget {shown(key)}", key.strip(), "") for key in args.forget]
        with RunFile.open(args.run) as run:
            named = resolve(run, wanted + forgotten)
            labels = _labels(run, run_families(run))
            with_text = text_named(run, list(named))
            in_run = set(run_names(run))
        where = keep(args, {family: name or None for family, (_, name) in named.items()}, in_run)
    except (NamingError, StoreError) as error:
        print(f"kvscope: error: {error}", file=sys.stderr)
        return 2
    for family, (_, name) in named.items():
        label = f"family {family:016x} ({shown(labels.get(family, ''))})"
        if not name:
            print(f"{label}: its name forgotten")
            continue
        note = " (its prompt text names it where a tokenizer reads it)"
        print(f"{label} named {shown(name)}{note if family in with_text else ''}")
    given = sum(1 for _, name in named.values() if name)
    print(f"{given} named, {len(named) - given} forgotten, {where}")
    return 0
