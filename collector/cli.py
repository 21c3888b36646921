"""The `kvscope` command line. Exit codes: 0 done, 2 bad input (file, line and reason on stderr);
`kvscope report` exits 1 when a check regressed.

Each subcommand lives in `collector/commands/<name>.py` and registers itself with
`register(commands)`; vLLM, torch and the HTML report's plotly are imported when a command
runs, not when the parser is built.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from collector.commands import (
    advise,
    app,
    calibrate,
    collect,
    doctor,
    explain,
    export,
    finish,
    generate,
    names,
    prompt_trace,
    replay,
    report,
    summary,
    whatif,
)
from collector.replay.traces import TraceError
from collector.store.run_file import ReadError, StoreError
from collector.unavailable import Unavailable

EXIT_BAD_INPUT = 2
COMMANDS = (
    replay,
    summary,
    explain,
    generate,
    collect,
    finish,
    report,
    prompt_trace,
    whatif,
    calibrate,
    advise,
    names,
    export,
    app,
    doctor,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvscope", description="See and tune vLLM's automatic prefix caching."
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except (TraceError, StoreError, ValueError, Unavailable) as error:
        print(f"kvscope: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # the reader went away (`| head`): stop without a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except ReadError as error:  # a run file damaged where opening it could not tell
        reason = str(error).splitlines()[0]
        print(f"kvscope: error: a run file cannot be read: {reason}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
