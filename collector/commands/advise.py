"""`kvscope advise`: ranked tuning suggestions for a run, as Markdown or JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from collector.advisor import RunContext, advise
from collector.advisor.context import PCIE_GB_PER_S
from collector.advisor.formats import to_document, to_markdown
from collector.commands.kv_options import add_kv_options, gpu_from, kv_spec_from
from collector.replay.whatif import read_results
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
    add_kv_options(parser)
    parser.set_defaults(handler=_run_advise)


def _run_advise(args: argparse.Namespace) -> int:
    whatif = read_results(args.whatif).results if args.whatif else []
    store = RunStore.open(args.run)
    try:
        context = RunContext(
            store,
            args.run,
            kv_spec_from(args),
            gpu_from(args),
            whatif,
            max_model_len=args.max_model_len,
            pcie_gb_per_s=args.pcie_gb_per_s,
        )
        advice = advise(context)
        if args.json:
            print(json.dumps(to_document(advice, context), sort_keys=True))
        else:
            print(to_markdown(advice, context), end="")
    finally:
        store.close()
    return 0
