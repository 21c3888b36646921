"""The app's server, as `kvscope app` starts it: Streamlit's own command line, in a process that
imports the app's modules (pandas, Plotly, DuckDB, kvscope's own) as soon as Streamlit's
runtime is up, while a browser is still loading the page. The first page's script then finds
them loaded instead of importing them itself: about a second of the app's opening on this
project's 2-core machine (benchmarks/page_timing.py).

    python -m visualizer.server run visualizer/app.py [Streamlit's options] [-- --db RUN]

`streamlit run visualizer/app.py` serves the same app; its first view pays for the imports.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
import time

from streamlit import runtime
from streamlit.web import cli

import visualizer

# Page scripts draw when imported (Streamlit runs them); the app and this module start things.
NOT_PRELOADED = ("visualizer.views", "visualizer.app", "visualizer.server")


def preload() -> None:
    """Import every module of the app but its scripts, once Streamlit's runtime exists (their
    caches attach to it)."""
    while not runtime.exists():
        time.sleep(0.05)
    for module in pkgutil.walk_packages(visualizer.__path__, "visualizer."):
        if not module.name.startswith(NOT_PRELOADED):
            importlib.import_module(module.name)


def main() -> None:
    threading.Thread(target=preload, name="kvscope-preload", daemon=True).start()
    cli.main(prog_name="streamlit")  # exits


if __name__ == "__main__":
    main()
