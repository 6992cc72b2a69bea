"""Every benchmark reports `vllm bench serve`'s percentile (numpy's default,
linear interpolation), whatever unit it reports in."""

from __future__ import annotations

import random

import numpy
import pytest

from shoal.bench.router_http import _pct
from shoal.bench.stats import percentile


def test_the_router_benchmarks_report_numpys_percentile_in_milliseconds() -> None:
    rng = random.Random(1)
    for size in (1, 2, 7, 100, 257):
        samples_ns = [rng.randrange(10**5, 10**8) for _ in range(size)]
        for p in (50, 99):
            expected = round(float(numpy.percentile(samples_ns, p)) / 1e6, 3)
            assert _pct(samples_ns, p) == pytest.approx(expected, abs=1e-3)


def test_a_p99_of_a_hundred_samples_lies_between_the_two_largest() -> None:
    """Not the largest, as a nearest-rank p99 of 100 samples would be."""
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile(values, 100) == 100.0
