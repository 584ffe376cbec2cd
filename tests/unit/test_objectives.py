"""objectives/: lookup by name, and one shared suite run over every objective in OBJECTIVES."""

import math

import pytest

from objectives import OBJECTIVES, get_objective
from objectives.latency import ALLOWED
from optimizer.measure.metrics import summarize
from optimizer.measure.replay import ReplayResult, RequestRecord
from optimizer.measure.slo import parse_slos


def result(scale: float) -> ReplayResult:
    """Two completed requests; `scale` stretches every time (2.0 = a server twice as slow)."""
    recs = tuple(RequestRecord(f"r{i}", 0.0, 0.0, 0.1 * scale, 0.5 * scale,
                               tuple(0.1 * scale * k for k in range(1, 6)), 10, 5, 5, True, 200)
                 for i in range(2))
    return ReplayResult(recs, window_s=0.5 * scale)


FAST, SLOW = summarize(result(1.0)), summarize(result(2.0))


def test_lookup_by_name_and_directions():
    assert get_objective("throughput").direction == "maximize"
    assert get_objective("latency").direction == "minimize"
    assert (get_objective("throughput").metric, get_objective("latency").metric) == ("output_throughput", "ttft_p95")


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError) as err:
        get_objective("goodness")
    assert "goodness" in str(err.value)
    assert all(name in str(err.value) for name in OBJECTIVES)


def test_latency_metric_option():
    obj = get_objective("latency", "e2el_p95")
    assert obj.metric == "e2el_p95"
    assert obj.score({"e2el_ms_p95": 812.5, "ttft_ms_p95": 40.0}) == 812.5
    with pytest.raises(ValueError, match="ttft_p96"):
        get_objective("latency", "ttft_p96")
    with pytest.raises(ValueError, match="tokens_per_joule"):
        get_objective("throughput", "tokens_per_joule")


@pytest.mark.parametrize("metric", ALLOWED)
def test_every_latency_metric_reads_a_key_the_replay_reports(metric):
    assert get_objective("latency", metric).score(FAST) > 0


@pytest.mark.parametrize("metric, unit", [("output_throughput", "tok/s"), ("total_token_throughput", "tok/s"),
                                          ("request_throughput", "req/s")])
def test_every_throughput_metric_reads_a_key_the_replay_reports(metric, unit):
    obj = get_objective("throughput", metric)
    assert obj.score(FAST) == FAST[metric] and obj.unit == unit


SLOS = parse_slos("ttft:500 tpot:50")


def make(name):
    return get_objective(name, slos=SLOS)


def scored(metrics: dict, rate: float) -> dict:
    """A trial's metrics as a goodput trial reports them too (the rate search's answer)."""
    return {**metrics, "goodput_rate": rate}


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
class TestEveryObjective:
    def test_declares_its_interface(self, name):
        obj = make(name)
        assert obj.name == name and obj.unit and obj.mode in ("replay", "goodput")
        assert obj.directions and all(d in ("maximize", "minimize") for d in obj.directions)
        assert obj.direction == obj.directions[0]

    def test_scores_real_metrics_and_prefers_the_faster_server(self, name):
        obj = make(name)
        fast, slow = obj.score(scored(FAST, 2.0)), obj.score(scored(SLOW, 1.0))
        fast, slow = (fast, slow) if isinstance(fast, list) else ([fast], [slow])
        assert len(fast) == len(obj.directions)
        for f, s, direction in zip(fast, slow, obj.directions):
            assert math.isfinite(f) and math.isfinite(s) and f != s
            assert (f > s) == (direction == "maximize")

    def test_nan_or_missing_metric_is_a_value_error(self, name):
        obj = make(name)
        with pytest.raises(ValueError):
            obj.score({k: math.nan for k in scored(FAST, math.nan)})
        with pytest.raises(ValueError):
            obj.score({})


def test_goodput_needs_slos_and_searches_the_rate():
    with pytest.raises(ValueError, match="needs SLOs"):
        get_objective("goodput")
    obj = make("goodput")
    assert obj.mode == "goodput" and obj.slos == SLOS and obj.score(scored(FAST, 3.5)) == 3.5


def test_pareto_is_throughput_up_latency_down():
    obj = get_objective("pareto", "e2el_p95")
    assert obj.directions == ("maximize", "minimize") and obj.multi
    assert obj.score(FAST) == [FAST["output_throughput"], FAST["e2el_ms_p95"]]
    with pytest.raises(ValueError, match="ttft_p42"):
        get_objective("pareto", "ttft_p42")


def fleet(**spec):
    from optimizer.config.schema import FleetSpec
    return get_objective("fleet", slos=SLOS, fleet=FleetSpec(**spec))


def test_the_fleet_is_scored_by_the_devices_the_peak_needs_fewest_first():
    obj = fleet(peak_qps=50, headroom=0.2, budget=16)
    assert (obj.direction, obj.metric, obj.unit) == ("minimize", "fleet_devices", "devices")
    one = {"goodput_rate": 10.0, "devices": 1.0, "ttft_ms_p95": 250.0}  # 8 req/s usable: 7 replicas
    tp2 = {"goodput_rate": 25.0, "devices": 2.0, "ttft_ms_p95": 250.0}  # 20 usable: 3 replicas of 2
    assert obj.devices(one) == 7 and obj.devices(tp2) == 6
    assert obj.score(one) == pytest.approx(7 + 0.25 / 1.25) and obj.score(tp2) < obj.score(one)
    assert obj.replicas(12.5) == 5  # exactly 10 usable per replica: 5, not 6 by rounding
    faster = {**tp2, "ttft_ms_p95": 100.0}  # the same devices: the lower tail ranks first, never a device less
    assert 6 < obj.score(faster) < obj.score(tp2) < 7
    assert obj.constraints(one) == {"fleet_budget": -9.0}
    assert obj.constraints({**one, "goodput_rate": 3.0}) == {"fleet_budget": 5.0}  # 21 devices: over the budget
    none = {**one, "goodput_rate": 0.0}  # holds the SLOs at no rate: no fleet carries the peak
    assert obj.devices(none) is None and obj.score(none) == 1e6 and obj.constraints(none)["fleet_budget"] > 0
    assert "peak 50 req/s, headroom 20%, budget 16" in obj.terms


def test_without_a_peak_the_fleet_objective_scores_goodput_per_device():
    obj = fleet()
    assert (obj.direction, obj.metric) == ("maximize", "goodput_per_device") and obj.constraints({}) == {}
    assert obj.score({"goodput_rate": 10.0, "devices": 2.0}) == 5.0
    assert obj.score({"goodput_rate": 10.0}) == 10.0  # a replica that did not say: one device
    with pytest.raises(ValueError, match="objective.fleet is for the fleet objective, not 'goodput'"):
        get_objective("goodput", slos=SLOS, fleet=object())
    with pytest.raises(ValueError, match="fleet objective: needs SLOs"):
        get_objective("fleet")
