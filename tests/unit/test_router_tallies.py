"""The request path's tallies are exposed as prometheus_client's own Counter
and Histogram would expose the same updates."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from shoal.router.tallies import CounterFamily, HistogramFamily

BUCKETS = (0.005, 0.01, 0.025, 0.5, 1, 2.5)
REPLICAS = ("engine-0", "engine-1", 'quoted"\\name')
# Values on the bounds themselves, just beside them, beyond the last one.
VALUES = st.one_of(
    st.sampled_from(BUCKETS),
    st.floats(min_value=0, max_value=10, allow_nan=False),
    st.sampled_from((0.0, 0.0049999, 0.0050001, 3.0, 1e9)),
)
UPDATES = st.lists(st.tuples(st.sampled_from(REPLICAS), VALUES), max_size=40)
CREATED = re.compile(r"^(\S+_created(?:\{[^}]*\})?) \S+$", re.MULTILINE)


def _text(registry: CollectorRegistry) -> str:
    # Creation times differ between the two; everything else must not.
    return CREATED.sub(r"\1 T", generate_latest(registry).decode())


@given(UPDATES)
def test_a_histogram_reads_as_prometheus_clients(updates: list[tuple[str, float]]) -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Histogram("t_seconds", "Doc.", ["replica"], buckets=BUCKETS, registry=theirs)
    tallied = HistogramFamily("t_seconds", "Doc.", ["replica"], registry=ours, buckets=BUCKETS)
    for replica, value in updates:
        reference.labels(replica).observe(value)
        tallied.labels(replica).observe(value)
    assert _text(ours) == _text(theirs)


@given(st.lists(VALUES, max_size=20))
def test_a_histogram_without_labels_reads_as_prometheus_clients(values: list[float]) -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Histogram("d_seconds", "Doc.", buckets=BUCKETS, registry=theirs)
    tallied = HistogramFamily("d_seconds", "Doc.", [], registry=ours, buckets=BUCKETS).labels()
    for value in values:
        reference.observe(value)
        tallied.observe(value)
    assert _text(ours) == _text(theirs)


@given(UPDATES)
def test_a_counter_reads_as_prometheus_clients(updates: list[tuple[str, float]]) -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Counter("r", "Doc.", ["replica", "code"], registry=theirs)
    tallied = CounterFamily("r", "Doc.", ["replica", "code"], registry=ours)
    for replica, value in updates:
        code = str(int(value) % 3 + 200)
        reference.labels(replica, code).inc(value)
        tallied.labels(replica, code).inc(value)
    assert _text(ours) == _text(theirs)


def test_a_removed_series_is_no_longer_exposed() -> None:
    registry = CollectorRegistry()
    tallied = HistogramFamily("t_seconds", "Doc.", ["replica"], registry=registry, buckets=BUCKETS)
    tallied.labels("engine-0").observe(0.1)
    tallied.labels("engine-1").observe(0.1)
    tallied.remove("engine-0")
    assert registry.get_sample_value("t_seconds_count", {"replica": "engine-1"}) == 1.0
    assert registry.get_sample_value("t_seconds_count", {"replica": "engine-0"}) is None


def test_wrong_label_values_and_a_second_family_of_a_name_are_refused() -> None:
    registry = CollectorRegistry()
    tallied = CounterFamily("r", "Doc.", ["replica", "code"], registry=registry)
    with pytest.raises(ValueError, match="takes labels"):
        tallied.labels("engine-0")
    with pytest.raises(ValueError, match="Duplicated"):
        Counter("r", "Doc.", registry=registry)
