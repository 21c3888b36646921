"""A package a command needs and this Python environment lacks: the error says which, and
how to install it; `kvscope` exits 2 on it as on bad input (collector/cli.py)."""

from __future__ import annotations


class Unavailable(RuntimeError):
    """A package a command needs is missing, or the service it reaches does not answer."""
