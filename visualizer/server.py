"""The app's server, as `kvscope app` starts it: Streamlit's own command line, in a process that
has imported the app's modules before a browser can open a page: kvscope's collector (with
pandas, Plotly and DuckDB) before the server listens, the app's own modules (whose caches
attach to Streamlit's runtime) as soon as the runtime is up. The first page's script then
finds them loaded instead of importing them itself (benchmarks/page_timing.py).

    python -m visualizer.server run visualizer/app.py [Streamlit's options] [-- --db RUN]

`streamlit run visualizer/app.py` serves the same app; its first view pays for the imports.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
import threading
import time

from streamlit import runtime
from streamlit.web import cli

import collector
import visualizer

# Page scripts draw when imported (Streamlit runs them); the app and this module start things.
NOT_PRELOADED = ("visualizer.views", "visualizer.app", "visualizer.server")


def preload_collector() -> None:
    """Import every module of kvscope's collector: what the app reads runs with (none loads
    vLLM; a page that replays imports it itself)."""
    for module in pkgutil.walk_packages(collector.__path__, "collector."):
        _import(module.name)


def preload_app() -> None:
    """Import every module of the app but its scripts, once Streamlit's runtime exists (their
    caches attach to it)."""
    while not runtime.exists():
        time.sleep(0.05)
    for module in pkgutil.walk_packages(visualizer.__path__, "visualizer."):
        if not module.name.startswith(NOT_PRELOADED):
            _import(module.name)


def _import(name: str) -> None:
    """Import a module, unless it needs a package this environment lacks: the page that uses
    it says so when it is opened, as without the preload."""
    with contextlib.suppress(ImportError):
        importlib.import_module(name)


def main() -> None:
    preload_collector()
    threading.Thread(target=preload_app, name="kvscope-preload", daemon=True).start()
    cli.main(prog_name="streamlit")  # exits


if __name__ == "__main__":
    main()
