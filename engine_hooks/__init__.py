"""kvscope's engine side: block-event records and the hooks that capture them inside vLLM.

Imports vLLM, msgspec and the standard library only: never DuckDB, Streamlit, Plotly or pandas.
"""

from __future__ import annotations

from engine_hooks.buffer import EventBuffer
from engine_hooks.events import EVENT_KINDS, Event
from engine_hooks.hooks import KVCacheHooks
from engine_hooks.layout import UnsupportedCacheLayout
from engine_hooks.privacy import Pseudonymizer, load_secret

__all__ = [
    "EVENT_KINDS",
    "Event",
    "EventBuffer",
    "KVCacheHooks",
    "Pseudonymizer",
    "UnsupportedCacheLayout",
    "load_secret",
]
