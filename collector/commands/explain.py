"""`kvscope explain`: why a run's prompt tokens missed the prefix cache (docs/miss-causes.md),
or one request's: as text an operator reads, or as JSON. Exit 0; 2 on bad input (no such
request, a damaged run, a run made before miss causes, a missing file), one line on stderr."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from collector.commands.explain_text import breakdown_lines, request_lines
from collector.commands.explanation import request_explanation, run_breakdown
from collector.queries.config import recorded_tokenizer, run_config
from collector.queries.request_search import prompt_token_ids, request_row
from collector.safe_text import shown
from collector.store.recorded_schema import recorded_schema
from collector.store.run_file import RunBeingWritten, RunFile, StoreError, open_readable
from collector.token_text import TextTokenizer, load_local_tokenizer

MISS_CAUSES_SCHEMA = 9  # the run schema version that brought the table `lookup_causes`
MISS_CAUSES_TABLE = "lookup_causes"
PromptText = Callable[[int, int], str | None]


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "explain",
        help="why the prompt tokens of a run (or of one request) missed the prefix cache: "
        "each cause's tokens and share, the prefix families that lost most",
    )
    parser.add_argument("run", type=Path, help="run file (.duckdb) or Parquet dataset")
    parser.add_argument(
        "--request",
        metavar="ID",
        help="one request: its lookups and, per missed block, the cause and its details",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--tokenizer",
        metavar="NAME",
        help="the tokenizer that shows prompts as text (a family's first block, --request's "
        "missed blocks), where the run recorded token ids (default: $KVSCOPE_TOKENIZER, else "
        "the one the run names; nothing is downloaded)",
    )
    parser.set_defaults(handler=_run_explain)


def _run_explain(args: argparse.Namespace) -> int:
    run = open_explained(args.run)
    try:
        if args.request is None:
            document = run_breakdown(run, lambda: run_tokenizer(run, args.tokenizer)[0])
            lines = breakdown_lines(document)
        else:
            request = request_row(run, args.request)
            if request is None:
                raise ValueError(f'{args.run}: no request "{shown(args.request)}" in this run')
            text, source = prompt_text(run, args.request, args.tokenizer)
            document = request_explanation(
                run, request, text, lambda: run_tokenizer(run, args.tokenizer)[0]
            ) | {"text_from": source}
            lines = request_lines(document)
    finally:
        run.close()
    print(json.dumps(document, sort_keys=True) if args.json else "\n".join(lines))
    return 0


def open_explained(path: Path) -> RunFile:
    """The run opened for reading (its live copy while a collector writes it); a run made
    before miss causes is refused saying so, and how to make one that has them."""
    try:
        return open_readable(path)[0]
    except RunBeingWritten:
        raise
    except StoreError as error:
        schema = recorded_schema(path)
        if schema is None or (schema.version or 0) > MISS_CAUSES_SCHEMA:
            raise
        if (schema.version or 0) == MISS_CAUSES_SCHEMA and MISS_CAUSES_TABLE in schema.tables:
            raise
        made = (
            f"its schema version is {schema.version}, and they came with version "
            f"{MISS_CAUSES_SCHEMA}"
            if (schema.version or 0) < MISS_CAUSES_SCHEMA
            else f"it lacks their table, {MISS_CAUSES_TABLE}"
        )
        raise StoreError(
            f"{path}: the run predates miss causes ({made}): replay its trace again with this "
            "kvscope (`kvscope replay TRACE --out RUN.duckdb`) to explain its misses"
        ) from error


def prompt_text(run: RunFile, request: str, tokenizer: str | None) -> tuple[PromptText, str | None]:
    """The request's prompt tokens `first..end` as text, and where the text comes from (None:
    nowhere, the run recorded no token ids): the run's tokenizer (`run_tokenizer`), or the
    token ids themselves when it is not on this machine."""
    tokens = prompt_token_ids(run, request)
    if tokens is None:
        return (lambda first, end: None), None
    loaded, name = run_tokenizer(run, tokenizer)
    if loaded is None:
        return (lambda first, end: " ".join(map(str, tokens[first:end])) or None), "token ids"
    return (lambda first, end: loaded.decode(tokens[first:end]) or None), f"tokenizer {name}"


def run_tokenizer(run: RunFile, tokenizer: str | None) -> tuple[TextTokenizer | None, str]:
    """The tokenizer named (`tokenizer`, else $KVSCOPE_TOKENIZER, else the one the run names)
    and its name, if it is on this machine (nothing is downloaded)."""
    name = tokenizer or os.environ.get("KVSCOPE_TOKENIZER") or recorded_tokenizer(run_config(run))
    return (load_local_tokenizer(name) if name else None), name
