"""traffic/histogram.py: deltas (a restart is a restart), sums across servers, PromQL's quantiles."""

import math

import pytest

from optimizer.traffic.histogram import Histogram, counter_delta

INF = math.inf


def h(counts, bounds=(1.0, 2.0, 5.0, INF), total=0.0):
    return Histogram(tuple(bounds), tuple(float(c) for c in counts), total)


def test_a_counter_that_drops_restarted_so_its_delta_is_the_new_value():
    assert counter_delta(130.0, 100.0) == 30.0
    assert counter_delta(5.0, 130.0) == 5.0  # the server restarted and counted 5 since
    assert counter_delta(7.0, None) == 0.0  # no earlier read: nothing is known to have happened


def test_quantiles_interpolate_inside_the_bucket_as_histogram_quantile_does():
    x = h([0, 10, 20, 20])  # 10 in (1, 2], 10 in (2, 5]
    assert x.quantile(0.5) == pytest.approx(2.0)  # rank 10: the top of (1, 2]
    assert x.quantile(0.75) == pytest.approx(3.5)  # rank 15: halfway through (2, 5]
    assert x.quantile(0.25) == pytest.approx(1.5)
    assert h([4, 4, 4, 4]).quantile(0.5) == pytest.approx(0.5)  # the first bucket starts at 0
    assert h([0, 0, 0, 3]).quantile(0.5) == 5.0  # in +Inf: the highest finite bound
    assert h([0, 0, 0, 0]).quantile(0.5) is None


def test_since_is_the_observations_between_two_reads_and_all_of_them_after_a_restart():
    early, late = h([1, 3, 6, 6], total=20.0), h([2, 5, 9, 10], total=45.0)
    d = late.since(early)
    assert d.counts == (1.0, 2.0, 3.0, 4.0) and d.total == 25.0 and d.count == 4.0
    restarted = h([0, 1, 2, 2], total=6.0)
    assert restarted.since(late) == restarted
    assert late.since(None) == late


def test_servers_with_other_buckets_add_up_on_the_bounds_they_share():
    a = h([1, 2, 3, 4], total=10.0)
    b = Histogram((2.0, 10.0, INF), (5.0, 6.0, 7.0), 30.0)
    both = a.plus(b)
    assert both.bounds == (2.0, INF) and both.counts == (7.0, 11.0) and both.total == 40.0


def test_round_trip_through_json_keeps_infinity():
    x = h([1, 2, 3, 4], total=9.5)
    assert x.to_dict()["bounds"][-1] == "+Inf"
    assert Histogram.from_dict(x.to_dict()) == x
