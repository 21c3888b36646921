"""The run's time grid (the rollups' buckets) and a window of it that every page filters by.

A window is a whole number of buckets, so a figure read from a rollup table and the same
figure counted from raw events agree exactly: both take `start_ns <= ts_ns < end_ns`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

NS_PER_S = 1_000_000_000


@dataclass(frozen=True)
class TimeWindow:
    """Buckets `first_bucket..last_bucket` (inclusive): absolute `start_ns <= ts < end_ns`."""

    first_bucket: int
    last_bucket: int
    start_ns: int
    end_ns: int
    run_start_ns: int
    is_whole_run: bool

    @property
    def start_s(self) -> float:
        """Seconds from the run's first record to the window's start."""
        return (self.start_ns - self.run_start_ns) / NS_PER_S

    @property
    def end_s(self) -> float:
        """Seconds from the run's first record to the window's end."""
        return (self.end_ns - self.run_start_ns) / NS_PER_S

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / NS_PER_S

    @property
    def num_buckets(self) -> int:
        return self.last_bucket - self.first_bucket + 1


@dataclass(frozen=True)
class TimeGrid:
    """Bucket `b` of a run covers `start_ns + b * bucket_ns` up to the next bucket."""

    start_ns: int
    end_ns: int
    bucket_ns: int
    block_bin_size: int

    @property
    def last_bucket(self) -> int:
        return (self.end_ns - self.start_ns) // self.bucket_ns

    @property
    def bucket_s(self) -> float:
        return self.bucket_ns / NS_PER_S

    @property
    def span_s(self) -> float:
        """The grid's length in seconds: whole buckets, the last record's included."""
        return (self.last_bucket + 1) * self.bucket_ns / NS_PER_S

    def buckets(self, first_bucket: int, last_bucket: int) -> TimeWindow:
        """The window of buckets `first_bucket..last_bucket`, clamped to the run."""
        first = min(max(first_bucket, 0), self.last_bucket)
        last = min(max(last_bucket, first), self.last_bucket)
        return TimeWindow(
            first_bucket=first,
            last_bucket=last,
            start_ns=self.start_ns + first * self.bucket_ns,
            end_ns=self.start_ns + (last + 1) * self.bucket_ns,
            run_start_ns=self.start_ns,
            is_whole_run=first == 0 and last == self.last_bucket,
        )

    def whole_run(self) -> TimeWindow:
        return self.buckets(0, self.last_bucket)

    def window(self, start_s: float, end_s: float) -> TimeWindow:
        """The buckets that cover seconds `start_s..end_s` from the run's first record."""
        first = math.floor(start_s / self.bucket_s + 1e-9)
        last = math.ceil(end_s / self.bucket_s - 1e-9) - 1
        return self.buckets(first, last)
