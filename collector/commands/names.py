"""`kvscope names`: names for what a run shows by label.

--names FILE: a run's pseudonyms mapped back to the names you give, for someone who holds the
secret that made them (the engine's $KVSCOPE_SECRET or ~/.config/kvscope/secret). A
pseudonym is a keyed hash (HMAC) of a name, so it cannot be turned back into the name; but
whoever holds the key can hash candidate names (a customer list) and match them.

--family KEY=NAME, --families FILE: a name for a prefix family, shown on every page and by
`kvscope explain` where the run recorded no prompt text to name it by (before its tenant and
first request). KEY is the family's label as shown, a request id of it, or its hash. Every
key and name is checked before any is kept: on a bad one, nothing is. For example:

    kvscope names run.duckdb --family "rag-80=Nightly RAG" --family "9ae5f786=Support bot"
    kvscope names run.duckdb --forget "Nightly RAG"
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from collector.commands.family_naming import add_arguments, name_families
from collector.model.nicknames import nickname
from collector.queries.tenants import labels_in_run
from collector.safe_text import shown
from collector.store.run_file import RunFile
from engine_hooks.privacy import Pseudonymizer, load_secret


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "names",
        help="name a run's prefix families (--family KEY=NAME), or map its pseudonymous "
        "tenants, adapters and salts back to names you give, with the secret that made them",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run", type=Path, help="run file (.duckdb) or Parquet dataset")
    parser.add_argument(
        "--names",
        type=Path,
        dest="names_file",
        help="candidate names, one per line (tenant, adapter and salt names alike)",
    )
    add_arguments(parser)
    parser.set_defaults(handler=_run_names)


def _run_names(args: argparse.Namespace) -> int:
    naming = bool(args.family or args.forget or args.families is not None)
    if args.names_file is None and not naming:
        print(
            "kvscope: error: names: give --names FILE, --family KEY=NAME, --families FILE "
            "or --forget KEY",
            file=sys.stderr,
        )
        return 2
    if naming:
        status = name_families(args)
        if status != 0 or args.names_file is None:
            return status
    return _pseudonyms(args)


def _pseudonyms(args: argparse.Namespace) -> int:
    try:
        lines = args.names_file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        print(f"kvscope: error: {args.names_file}: cannot read: {error}", file=sys.stderr)
        return 2
    candidates = [line.strip() for line in lines if line.strip()]
    pseudonyms = Pseudonymizer(load_secret())
    known: dict[str, str] = {}
    for name in candidates:
        for label in (pseudonyms.tenant(name), pseudonyms.lora(name), pseudonyms.salt(name)):
            if label is not None:
                known[label] = name
    with RunFile.open(args.run) as run:
        labels = labels_in_run(run)
    found = 0
    print(f"{'kind':8} {'pseudonym':20} {'nickname':16} name")
    for kind, label in labels:
        name = known.get(label)
        found += name is not None
        shown_name = shown(name) if name is not None else "(not among the names given)"
        shown_nickname = "" if kind == "salt" else shown(nickname(label))  # salts have none
        print(f"{kind:8} {shown(label):20} {shown_nickname:16} {shown_name}")
    print(f"{found} of {len(labels)} labels named with this machine's secret")
    return 0
