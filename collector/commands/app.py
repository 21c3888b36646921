"""`kvscope app`: the Streamlit app, on 127.0.0.1 and without usage statistics, from any folder.

`streamlit run visualizer/app.py` reads `.streamlit/config.toml` from the working folder only;
started elsewhere it would listen on every interface. This command passes the settings on
Streamlit's command line instead, so where it is started does not matter. It starts the
app's server module (`visualizer/server.py`: Streamlit's command line, the app's modules
imported while the browser loads).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

PRIVATE_SETTINGS = (
    "--server.address=127.0.0.1",
    "--browser.serverAddress=127.0.0.1",
    "--browser.gatherUsageStats=false",
    "--server.headless=true",
)


def register(commands: Any) -> None:
    parser = commands.add_parser("app", help="open the app on 127.0.0.1 (any working folder)")
    parser.add_argument("--db", type=Path, help="the run to show (default: the sample run)")
    parser.add_argument("--port", type=int, default=8501, help="port on 127.0.0.1")
    parser.set_defaults(handler=_run_app)


def _run_app(args: argparse.Namespace) -> int:
    spec = importlib.util.find_spec("visualizer")  # found, not imported: no Streamlit here
    assert spec is not None and spec.origin is not None
    app = Path(spec.origin).with_name("app.py")
    command = [sys.executable, "-m", "visualizer.server", "run", str(app), *PRIVATE_SETTINGS]
    command += [f"--server.port={args.port}"]
    if args.db is not None:
        command += ["--", "--db", str(args.db.resolve())]
    os.execv(sys.executable, command)
    return 0  # not reached: Streamlit replaces this process
