"""`kvscope doctor`: whether kvscope can capture vLLM's prefix cache in this environment.

One screen: the vLLM and torch found here, whether that vLLM is in kvscope's support window,
whether the plugin's hooks find what they wrap (the contract) and record what vLLM does on
its own block manager (a real trial on the CPU), which KV cache layouts they mirror and which
they refuse and why, whether vLLM's own KV events can be read, whether vLLM will load the
plugin, and where the collector would listen. Each line says OK, WARN or FAIL; what to do
about each follows. Exit 0 when capture will work here, 1 when it will not (the last line
says why), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import textwrap
from typing import Any

from collector.commands.doctor_check import FAIL
from collector.commands.doctor_checks import run_checks
from collector.safe_text import shown

EXIT_WORKS, EXIT_FAILS = 0, 1
NAME_WIDTH = 12  # the longest check name: VLLM_PLUGINS
STATUS_WIDTH = 5


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "doctor",
        help="check whether capture will work in this environment (vLLM, the plugin, the "
        "layouts, the collector's endpoint)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", action="store_true", help="one JSON object instead of text")
    parser.set_defaults(handler=_run_doctor)


def _run_doctor(args: argparse.Namespace) -> int:
    checks = run_checks()
    failed = [check for check in checks if check.status == FAIL]
    if failed:
        first, *others = failed
        also = sorted({check.name for check in others} - {first.name})
        verdict = f"capture will NOT work here: {first.name}: {first.reason}" + (
            f" (failing too: {', '.join(also)})" if also else ""
        )
    else:
        vllm = next(check for check in checks if check.name == "vLLM")
        switched_off = any(check.name == "switch" and check.status != "OK" for check in checks)
        verdict = f"capture will work here, with vLLM {vllm.figures['version']}" + (
            ", once KVSCOPE_CAPTURE=1 is set where vLLM starts" if switched_off else ""
        )
    if args.json:
        print(
            json.dumps(
                {
                    "capture_will_work": not failed,
                    "verdict": verdict,
                    "checks": [
                        {
                            "status": check.status,
                            "name": check.name,
                            "reason": check.reason,
                            "fix": check.fix,
                            "detail": check.detail,
                            "figures": dict(check.figures),
                        }
                        for check in checks
                    ],
                },
                sort_keys=True,
            )
        )
    else:
        _print_screen(checks, verdict)
    return EXIT_FAILS if failed else EXIT_WORKS


def _print_screen(checks: list[Any], verdict: str) -> None:
    """Aligned lines, each wrapped to the terminal; the fixes; the verdict."""
    width = max(shutil.get_terminal_size((100, 24)).columns, 60)
    indent = " " * (STATUS_WIDTH + NAME_WIDTH + 2)
    print(f"kvscope doctor: can kvscope capture vLLM's prefix cache here? ({shown(sys.prefix)})")
    print()
    for check in checks:
        head = f"{check.status:<{STATUS_WIDTH}} {check.name:<{NAME_WIDTH}} "
        print(_wrapped(shown(check.reason, limit=None), width, indent, head))
    fixes: dict[str, list[str]] = {}
    for check in checks:
        if check.status != "OK" and check.fix:
            fixes.setdefault(check.fix, [])
            if check.name not in fixes[check.fix]:
                fixes[check.fix].append(check.name)
    if fixes:
        print()
        print("What to do:")
        for fix, names in fixes.items():
            print(_wrapped(shown(fix, limit=None), width, "    ", f"  {', '.join(names)}: "))
    print()
    print(_wrapped(shown(verdict, limit=None), width, "  "))


def _wrapped(text: str, width: int, indent: str, head: str = "") -> str:
    """`head` then `text`, wrapped to `width`, later lines indented; words and flags whole (a
    path longer than a line stays on the line it starts)."""
    return textwrap.fill(
        text,
        width,
        initial_indent=head,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )
