"""The limits `kvscope report` holds a candidate run to, read from a TOML file.

Every key is optional; `docs/ci/thresholds.toml` lists them all with their defaults. An
unknown key, a wrong type or a negative number is bad input: `ThresholdsError` names the
file, the key and the reason.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collector.toml_file import read_toml


class ThresholdsError(ValueError):
    """A thresholds file kvscope cannot use; the message names the file, key and reason."""


@dataclass(frozen=True)
class RatioLimit:
    """A ratio that must not fall: more than `max_drop` under the baseline, or under `min`."""

    enabled: bool = True
    max_drop: float = 0.02
    min: float = 0.0


@dataclass(frozen=True)
class TokensSavedLimit:
    """Prompt tokens served from the cache may fall by at most `max_relative_drop`, or by
    `min_drop` tokens when that is more (a floor for small runs)."""

    enabled: bool = True
    max_relative_drop: float = 0.05
    min_drop: int = 256


@dataclass(frozen=True)
class PerRequestLimit:
    """A count per request (evictions, preemptions) may rise by `max_relative_increase` plus
    `max_increase`, or by `min_count_increase` in all (over what the baseline's rate gives
    for the candidate's requests) when that is more: a floor for small counts, so that 1 -> 4
    preemptions in 500 requests is not a regression."""

    enabled: bool = True
    max_relative_increase: float = 0.10
    max_increase: float = 1.0
    min_count_increase: int = 20


@dataclass(frozen=True)
class RegretLimit:
    """The share of evictions whose block was stored again (within `within_s` seconds when
    set above 0) may rise by at most `max_increase`."""

    enabled: bool = True
    max_increase: float = 0.05
    within_s: float = 0.0


@dataclass(frozen=True)
class FreeBlocksLimit(RatioLimit):
    """The fewest free blocks, as a share of the pool: at most `max_drop` under the baseline's
    share, and never under `min`; and no step without a free block (the pool ran empty)
    unless the baseline had one too, or `allow_empty`."""

    max_drop: float = 0.05
    allow_empty: bool = False


@dataclass(frozen=True)
class DroppedEventsLimit:
    """The candidate may lose at most `max` events (lost events make every figure short)."""

    enabled: bool = True
    max: int = 0


@dataclass(frozen=True)
class TenantLimit:
    """Each tenant's token hit ratio may drop by at most `max_drop`; tenants with fewer than
    `min_requests` requests in either run are skipped."""

    enabled: bool = True
    max_drop: float = 0.05
    min_requests: int = 10


@dataclass(frozen=True)
class Thresholds:
    """One section per configurable check; collisions always fail and have no section."""

    token_hit_ratio: RatioLimit = field(default_factory=RatioLimit)
    block_hit_ratio: RatioLimit = field(default_factory=RatioLimit)
    tokens_saved: TokensSavedLimit = field(default_factory=TokensSavedLimit)
    evictions_per_request: PerRequestLimit = field(default_factory=PerRequestLimit)
    eviction_regret: RegretLimit = field(default_factory=RegretLimit)
    min_free_blocks: FreeBlocksLimit = field(default_factory=FreeBlocksLimit)
    # No increase per request on top; a floor of 5 preemptions in all: a candidate that
    # preempts 6 times fails when the baseline never did, one that preempts 4 times passes.
    preemptions_per_request: PerRequestLimit = field(
        default_factory=lambda: PerRequestLimit(max_increase=0.0, min_count_increase=5)
    )
    dropped_events: DroppedEventsLimit = field(default_factory=DroppedEventsLimit)
    tenant_hit_ratio: TenantLimit = field(default_factory=TenantLimit)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)


def load_thresholds(path: Path | None) -> Thresholds:
    """The defaults, overridden by the file's values when a file is given."""
    if path is None:
        return Thresholds()
    document = read_toml(path, ThresholdsError)
    sections = {section.name: section for section in dataclasses.fields(Thresholds)}
    values: dict[str, Any] = {}
    for name, table in document.items():
        if name not in sections:
            raise ThresholdsError(
                f"{path}: unknown key '{name}'; known sections: {', '.join(sections)}"
            )
        if not isinstance(table, dict):
            raise ThresholdsError(f"{path}: '{name}' must be a table ([{name}])")
        default = getattr(Thresholds(), name)
        values[name] = _section(path, name, table, default)
    return Thresholds(**values)


def _section(path: Path, section: str, table: dict[str, Any], default: Any) -> Any:
    known = {option.name: option for option in dataclasses.fields(default)}
    for key, value in table.items():
        if key not in known:
            raise ThresholdsError(
                f"{path}: unknown key '{section}.{key}'; [{section}] takes {', '.join(known)}"
            )
        _check_value(path, f"{section}.{key}", value, type(getattr(default, key)))
    return dataclasses.replace(default, **table)


def _check_value(path: Path, key: str, value: Any, expected: type) -> None:
    if expected is bool:
        if not isinstance(value, bool):
            raise ThresholdsError(f"{path}: '{key}' must be true or false, got {value!r}")
        return
    kind = "an integer" if expected is int else "a number"
    number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if number is None or (expected is int and not isinstance(number, int)):
        raise ThresholdsError(f"{path}: '{key}' must be {kind}, got {value!r}")
    if number < 0:
        raise ThresholdsError(f"{path}: '{key}' must be >= 0, got {value}")
