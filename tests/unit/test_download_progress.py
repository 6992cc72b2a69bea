"""A download's progress as people read it in status: bytes of the total in
binary units with three digits, the share, and the time left at the current
rate (none before a rate is known); and what the operator accepts as a
progress from the download pod (nothing that is not one)."""

from __future__ import annotations

import pytest

from shoal.download.progress import Progress, describe, duration_text, from_json, size_text

GiB = 1 << 30


def test_a_70b_download_reads_as_gib_of_the_total_with_the_share_and_minutes_left() -> None:
    progress = Progress(
        bytes=int(12.3 * GiB), total_bytes=140 * GiB, bytes_per_second=(140 - 12.3) * GiB / 170
    )
    assert describe(progress) == "12.3 GiB of 140 GiB (8.8%), ~3 min left"


def test_before_a_rate_is_known_no_time_left_is_promised() -> None:
    assert describe(Progress(bytes=0, total_bytes=16 * GiB)) == "0 B of 16.0 GiB (0.0%)"


@pytest.mark.parametrize(
    ("count", "text"),
    [
        (980, "980 B"),
        (1000, "0.98 KiB"),
        (6 << 20, "6.00 MiB"),
        (int(12.34 * GiB), "12.3 GiB"),
        (410 * 10**9, "382 GiB"),
        (2 << 40, "2.00 TiB"),
    ],
)
def test_sizes_are_binary_units_with_three_digits(count: int, text: str) -> None:
    assert size_text(count) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.2, "1 s"), (40, "40 s"), (61, "2 min"), (3600, "1 h"), (7500, "2 h 5 min")],
)
def test_time_left_is_rounded_up_as_a_person_says_it(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text


def test_a_finished_download_is_100_percent_with_nothing_left_to_wait_for() -> None:
    done = Progress(bytes=5 * GiB, total_bytes=5 * GiB, bytes_per_second=GiB)
    assert done.fraction == 1.0 and done.seconds_left == 0
    assert describe(done) == "5.00 GiB of 5.00 GiB (100.0%)"


def test_the_served_json_reads_back_as_the_same_progress() -> None:
    progress = Progress(bytes=3, total_bytes=10, bytes_per_second=1.5, files=1, total_files=4)
    assert from_json(progress.to_json()) == progress


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        "12 of 40",
        {"bytes": 3},
        {"bytes": "x", "totalBytes": 4},
        {"bytes": -1, "totalBytes": 4},
        {"bytes": 1, "totalBytes": 4, "bytesPerSecond": float("nan")},
        {"bytes": float("inf"), "totalBytes": 4},  # JSON's 1e999, or Infinity
    ],
)
def test_anything_but_a_progress_is_no_progress(body: object) -> None:
    assert from_json(body) is None
