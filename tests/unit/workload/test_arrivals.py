"""workload/arrivals.py: every arrival process has the statistics its definition promises.

Large n and fixed seeds; tolerances come from the sampling spread of each statistic, not
from the implementation's own arithmetic.
"""

import math
import random
import statistics

import pytest

from optimizer.config.schema import build_config
from optimizer.config.workload_spec import ArrivalSpec
from optimizer.errors import ConfigError
from optimizer.workload.arrivals import Spikes, offsets, spike_schedule, trace_schedule
from optimizer.workload.stats import burstiness_cv, gaps, mean_rate

N = 4000


def schedule(seed: int = 0, n: int = N, **arrival) -> list[float]:
    return offsets(ArrivalSpec(**arrival), n, random.Random(seed))


def test_constant_is_exactly_evenly_spaced_from_zero():
    offs = schedule(process="constant", rate=8.0)
    assert offs[0] == 0.0 and len(offs) == N
    assert all(g == pytest.approx(0.125, abs=1e-9) for g in gaps(offs))
    assert burstiness_cv(offs) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
def test_poisson_has_the_rate_and_exponential_gaps(seed):
    offs = schedule(seed, process="poisson", rate=5.0)
    assert all(b > a for a, b in zip(offs, offs[1:]))
    assert mean_rate(offs) == pytest.approx(5.0, rel=0.03)
    assert burstiness_cv(offs) == pytest.approx(1.0, abs=0.08)  # exponential gaps: sd == mean
    g = gaps(offs)
    m = statistics.fmean(g)
    # exponential: P(gap > mean) = 1/e
    assert sum(x > m for x in g) / len(g) == pytest.approx(math.exp(-1), abs=0.03)


@pytest.mark.parametrize("burstiness, cv", [(0.25, 2.0), (4.0, 0.5)])
def test_gamma_keeps_the_rate_and_its_cv_is_one_over_sqrt_burstiness(burstiness, cv):
    for seed in (0, 1):
        offs = schedule(seed, process="gamma", rate=3.0, burstiness=burstiness)
        assert mean_rate(offs) == pytest.approx(3.0, rel=0.03)
        assert burstiness_cv(offs) == pytest.approx(cv, rel=0.12)


def test_gamma_burstiness_changes_the_shape_not_the_rate():
    bursty = schedule(process="gamma", rate=3.0, burstiness=0.25)
    smooth = schedule(process="gamma", rate=3.0, burstiness=4.0)
    poisson = schedule(process="poisson", rate=3.0)
    assert burstiness_cv(bursty) > burstiness_cv(poisson) > burstiness_cv(smooth)


def test_ramp_starts_near_start_rate_and_ends_near_rate():
    start, end = 1.0, 10.0
    offs = schedule(process="ramp", start_rate=start, rate=end)
    tenth = N // 10
    first, last = mean_rate(offs[:tenth]), mean_rate(offs[-tenth:])
    # over the first tenth the intended rate is between start and start + 10% of the climb
    # (400 exponential gaps: the measured rate is within 15% = 3 sigma of the intended one)
    assert start * 0.85 <= first <= (start + 0.1 * (end - start)) * 1.15
    assert (end - 0.1 * (end - start)) * 0.85 <= last <= end * 1.15
    middle = mean_rate(offs[N // 2 - tenth // 2:N // 2 + tenth // 2])
    assert first < middle < last
    assert middle == pytest.approx((start + end) / 2, rel=0.15)


def test_trace_keeps_its_gaps_times_the_scale_from_zero():
    stamps = [100.0, 100.5, 103.0, 110.0, 110.0, 130.25]
    half = trace_schedule(stamps, 0.5)
    same = offsets(ArrivalSpec(process="trace"), len(stamps), random.Random(0), stamps)
    assert same[0] == 0.0 and half[0] == 0.0
    assert same == pytest.approx([t - 100.0 for t in stamps])
    assert gaps(half) == pytest.approx([g / 2 for g in gaps(same)])
    faster = offsets(ArrivalSpec(process="trace", time_scale=0.5), len(stamps), random.Random(0), stamps)
    assert faster == pytest.approx(half)


def test_trace_process_without_timestamps_is_refused():
    with pytest.raises(ValueError, match="timestamps"):
        offsets(ArrivalSpec(process="trace"), 3, random.Random(0))


def test_spikes_rate_inside_and_outside_the_windows():
    base, spike, every, duration, first = 1.0, 12.0, 20.0, 3.0, 5.0
    offs = spike_schedule(N, Spikes(base, spike, every, duration, first), random.Random(0))
    assert all(b >= a for a, b in zip(offs, offs[1:]))
    end = offs[-1]

    def in_spike(t: float) -> bool:
        return t >= first and (t - first) % every < duration

    # time spent in spike windows up to `end`, counted window by window
    spike_time, k = 0.0, 0
    while first + k * every < end:
        s = first + k * every
        spike_time += min(s + duration, end) - s
        k += 1
    inside = sum(in_spike(t) for t in offs)
    assert inside / spike_time == pytest.approx(spike, rel=0.07)
    assert (N - inside) / (end - spike_time) == pytest.approx(base, rel=0.07)


def test_spikes_before_the_first_spike_run_at_base_rate():
    offs = spike_schedule(400, Spikes(2.0, 50.0, 1000.0, 1.0, 150.0), random.Random(3))
    early = [t for t in offs if t < 150.0]
    assert len(early) / 150.0 == pytest.approx(2.0, rel=0.15)


def test_closed_loop_sends_everything_at_zero():
    assert schedule(process="closed", concurrency=4, n=50) == [0.0] * 50


@pytest.mark.parametrize("arrival, words", [
    ({"process": "ramp", "rate": 4.0}, "start_rate"),
    ({"process": "gamma", "burstiness": 0.5}, "needs rate"),
    ({"process": "constant"}, "needs rate"),
    ({"process": "closed"}, "concurrency"),
    ({"process": "poisson", "rate": -1}, "greater than 0"),
    ({"process": "gamma", "rate": 1, "burstiness": 0}, "greater than 0"),
    ({"process": "weibull", "rate": 1}, "'poisson'"),
])
def test_bad_arrival_is_a_config_error_naming_workload_arrival(arrival, words):
    with pytest.raises(ConfigError) as err:
        build_config({"model": {"path": "/m"}, "workload": {"arrival": arrival}})
    msg = str(err.value)
    assert "field 'workload.arrival" in msg and words in msg, msg


class _Hung(Exception):
    pass


def _raise_hung(*_):
    raise _Hung


def test_spike_schedule_finishes_for_decimal_spike_lengths():
    import signal

    old = signal.signal(signal.SIGALRM, _raise_hung)
    signal.setitimer(signal.ITIMER_REAL, 1.0)  # 120 requests take a millisecond
    try:
        offs = spike_schedule(120, Spikes(1.0, 12.0, 20.0, 2.1, 5.0), random.Random(0))
    except _Hung:
        pytest.fail("spike_schedule(120, Spikes(1, 12, every 20 s, 2.1 s long, first at 5 s)) did not finish in 1 s")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert len(offs) == 120 and offs[-1] > 7.1
