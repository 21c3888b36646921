"""`kvscope names`: a run's pseudonyms mapped back to the names you give, for someone who
holds the secret that made them (the engine's $KVSCOPE_SECRET or ~/.config/kvscope/secret).

A pseudonym is a keyed hash (HMAC) of a name, so it cannot be turned back into the name; but
whoever holds the key can hash candidate names (a customer list) and match them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from collector.model.nicknames import nickname
from collector.queries.tenants import labels_in_run
from collector.safe_text import shown
from collector.store.run_file import RunFile
from engine_hooks.privacy import Pseudonymizer, load_secret


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "names",
        help="map a run's pseudonymous tenants, adapters and salts back to names you give, "
        "with the secret that made them",
        description=__doc__,
    )
    parser.add_argument("run", type=Path, help="run file (.duckdb) or Parquet dataset")
    parser.add_argument(
        "--names",
        type=Path,
        required=True,
        dest="names_file",
        help="candidate names, one per line (tenant, adapter and salt names alike)",
    )
    parser.set_defaults(handler=_run_names)


def _run_names(args: argparse.Namespace) -> int:
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
