"""`kvscope advise`: ranked tuning suggestions for a run, as Markdown or JSON."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from collector.advisor import RULES, RuleOutcome, RunContext, advise
from collector.advisor.context import PCIE_GB_PER_S
from collector.advisor.curves import whatif_curves
from collector.advisor.formats import to_document, to_markdown
from collector.advisor.stored import keep, lookup, result_record
from collector.commands.kv_options import add_kv_options, gpu_from, kv_spec_from
from collector.model.kv_memory import GpuMemory, KVSpec
from collector.replay.sweep_results import SweepResult
from collector.replay.whatif import read_results
from collector.safe_text import shown
from collector.store.run_file import RunStore


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "advise", help="ranked suggestions for a run: evidence, predicted effect, exact setting"
    )
    parser.add_argument("run", type=Path, help="run file (.duckdb) or Parquet dataset")
    parser.add_argument(
        "--whatif", type=Path, help="a `kvscope whatif` output folder to take the sweep from"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--pcie-gb-per-s",
        type=float,
        default=PCIE_GB_PER_S,
        help=f"host-to-GPU bandwidth a CPU tier's loads take, GB/s ({PCIE_GB_PER_S:g}: PCIe 4.0 "
        "x16 in practice)",
    )
    parser.add_argument(
        "--no-store",
        action="store_true",
        help="do not write the advice into the run file (it is kept in kvscope's cache "
        "folder instead); by default it is, for the app and the health scorecard to read",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="no progress lines (on stderr) while the rules run"
    )
    add_kv_options(parser)
    parser.set_defaults(handler=_run_advise)


def _run_advise(args: argparse.Namespace) -> int:
    progress = _Progress(quiet=args.quiet)
    whatif = read_results(args.whatif).results if args.whatif else []
    with _advising(
        args.run,
        progress,
        kv_spec_from(args),
        gpu_from(args),
        whatif,
        max_model_len=args.max_model_len,
        pcie_gb_per_s=args.pcie_gb_per_s,
    ) as (context, document, record):
        if args.json:
            print(json.dumps(document, sort_keys=True))
        else:
            print(to_markdown(document, context), end="")
    if record is not None:  # once the run is closed: it may be written now
        progress.note(
            keep(record, args.run, lambda: context.replay_cache, in_run=not args.no_store)
        )
    return 0


def advise_finished_run(path: Path, *, quiet: bool) -> tuple[int, str]:
    """Work out the advice of a run just finished (`kvscope replay` at its end) under the
    assumptions `kvscope advise RUN`, the Advisor page and the scorecard take by default, and
    keep it in the run file, so that none of them waits for the rules' replays through vLLM:
    the number of suggestions, and where the advice was kept, in a line. Progress on stderr
    as `kvscope advise` prints it, unless `quiet`."""
    told_nothing = argparse.ArgumentParser()
    add_kv_options(told_nothing)
    defaults = told_nothing.parse_args([])  # what `kvscope advise RUN` assumes
    progress = _Progress(quiet=quiet)
    with _advising(path, progress, kv_spec_from(defaults), gpu_from(defaults)) as advised:
        context, document, record = advised
    kept = (
        "the advice read back"
        if record is None
        else keep(record, path, lambda: context.replay_cache, in_run=True)
    )
    return len(document["suggestions"]), kept


@contextmanager
def _advising(
    path: Path,
    progress: _Progress,
    spec: KVSpec,
    gpu: GpuMemory | None = None,
    whatif: Sequence[SweepResult] = (),
    **options: Any,
) -> Iterator[tuple[RunContext, dict[str, Any], dict[str, Any] | None]]:
    """The run at `path` open, its context under these assumptions (`RunContext`'s, whose
    defaults are `kvscope advise`'s), the advice's document, and the record to keep of it
    once the run is closed (None: read back, nothing to keep)."""
    store = RunStore.open(path)  # a damaged run is refused in one line, before any progress
    try:
        progress.note(f"advising on {shown(path)}: {len(RULES)} rules to check")
        context = RunContext(store, path, spec, gpu, whatif, note=progress.note, **options)
        document, record = _document(context, progress)
        yield context, document, record
    finally:
        store.close()


def _document(
    context: RunContext, progress: _Progress
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The advice's document, kept from an earlier advise or worked out now, and then the
    record to keep of it (None: it was read, or is not kept)."""
    kept = lookup(context)
    if kept is not None:
        progress.note(f"  the advice worked out at {kept['stored_at']} for this run and code, read")
        return kept["document"], None
    advice = advise(context, checked=progress.checked)
    document = to_document(advice, context)
    return document, result_record(context, document, asdict(whatif_curves(context)))


class _Progress:
    """Lines on stderr as the advice is worked out: what starts that takes seconds, and each
    rule's outcome with the time it took (stdout keeps the advice alone)."""

    def __init__(self, *, quiet: bool) -> None:
        self.quiet = quiet
        self.done = 0
        self.since = time.perf_counter()

    def note(self, line: str) -> None:
        if not self.quiet:
            print(line, file=sys.stderr, flush=True)

    def checked(self, outcome: RuleOutcome) -> None:
        now = time.perf_counter()
        self.done += 1
        self.note(
            f"  [{self.done}/{len(RULES)}] {outcome.rule}: {outcome.status} "
            f"({now - self.since:.1f} s)"
        )
        self.since = now
