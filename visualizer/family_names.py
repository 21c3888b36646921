"""A prefix family's name on every page: collector/model/family_names.py names it (the CLI
names families the same way)."""

from __future__ import annotations

from collector.model.family_names import family_name

__all__ = ["family_name"]
