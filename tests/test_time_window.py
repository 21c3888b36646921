"""The time grid and its windows: whole buckets, clamped to the run."""

from __future__ import annotations

from collector.model.time_window import TimeGrid

GRID = TimeGrid(start_ns=1_000, end_ns=1_000 + 9_999, bucket_ns=1_000, block_bin_size=1)


def test_grid_covers_the_last_record_with_whole_buckets() -> None:
    assert GRID.last_bucket == 9
    assert GRID.span_s == 10 * 1_000 / 1e9


def test_whole_run() -> None:
    window = GRID.whole_run()
    assert (window.first_bucket, window.last_bucket) == (0, 9)
    assert (window.start_ns, window.end_ns) == (1_000, 11_000)
    assert window.is_whole_run
    assert window.num_buckets == 10


def test_seconds_snap_to_the_buckets_that_cover_them() -> None:
    window = GRID.window(2.5e-6, 4e-6)  # 2.5 us into the run up to 4 us: buckets 2 and 3
    assert (window.first_bucket, window.last_bucket) == (2, 3)
    assert (window.start_ns, window.end_ns) == (3_000, 5_000)
    assert (window.start_s, window.end_s, window.duration_s) == (2e-6, 4e-6, 2e-6)
    assert not window.is_whole_run


def test_windows_are_clamped_to_the_run() -> None:
    assert GRID.window(-5.0, 99.0) == GRID.whole_run()
    empty_end = GRID.window(3e-6, 3e-6)  # an empty range still holds one bucket
    assert (empty_end.first_bucket, empty_end.last_bucket) == (3, 3)
