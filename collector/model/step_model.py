"""How long a simulated engine step takes: the replay's step model, calibrated from a live
engine's step costs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepModel:
    """How long a simulated engine step takes (timestamps and scheduler timings)."""

    step_ms: float = 10.0
    prefill_us_per_token: float = 25.0
    decode_us_per_token: float = 0.0  # the scheduler timing's; the step model decodes in step_ms
