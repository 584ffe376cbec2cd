"""measure/slo.py: parsing SLOs the way vLLM's --goodput is written, judging metrics against them,
vLLM's per-request goodput, and the "lost beyond repair" arithmetic, checked against
metrics.percentile by brute force rather than against hand-copied numbers."""

import math
import random
from fractions import Fraction

import pytest

from optimizer.errors import ConfigError
from optimizer.measure import slo
from optimizer.measure.metrics import percentile, summarize
from optimizer.measure.replay import ReplayResult, RequestRecord

PCTS = (50, 90, 95, 99)


# --- parse_slos --------------------------------------------------------------------------------

def test_parse_vllm_goodput_style_defaults_to_p95():
    slos = slo.parse_slos("ttft:500 tpot:50 e2el:2000")
    assert slos == (slo.Slo("ttft", 500.0, 95), slo.Slo("tpot", 50.0, 95), slo.Slo("e2el", 2000.0, 95))
    assert [s.key for s in slos] == ["ttft_p95", "tpot_p95", "e2el_p95"]


def test_parse_percentiles_error_and_commas():
    slos = slo.parse_slos("ttft_p99:300, itl_p50:20,error:1")
    assert slos == (slo.Slo("ttft", 300.0, 99), slo.Slo("itl", 20.0, 50), slo.Slo("error", 1.0, 95))
    assert [s.key for s in slos] == ["ttft_p99", "itl_p50", "error_pct"]
    assert slo.parse_slos("ttft:500,tpot:50") == slo.parse_slos("ttft:500 tpot:50")
    assert slo.parse_slos("TTFT:500") == (slo.Slo("ttft", 500.0, 95),)
    # error:0 is meaningful (no failure allowed); a latency limit of 0 is not
    assert slo.parse_slos("error:0") == (slo.Slo("error", 0.0, 95),)
    assert slo.parse_slos("ttft_p90:12.5") == (slo.Slo("ttft", 12.5, 90),)


def test_parse_nothing():
    assert slo.parse_slos(None) == () and slo.parse_slos("") == () and slo.parse_slos("  ") == ()


@pytest.mark.parametrize("text, part", [
    ("ttft", "ttft"),
    ("ttft:abc", "ttft:abc"),
    ("ttft:-1", "ttft:-1"),
    ("ttft:0", "ttft:0"),
    ("ttft:inf", "ttft:inf"),
    ("ttft:nan", "ttft:nan"),
    ("ttft_p97:100", "ttft_p97:100"),
    ("foo:1", "foo:1"),
    ("error:101", "error:101"),
    ("error:-1", "error:-1"),
    ("ttft:500 tpot:50 ttft:400", "ttft:400"),  # the duplicate is named
    ("ttft:500 ttft_p95:400", "ttft_p95:400"),  # same key written two ways
    ("error:1 error:2", "error:2"),
    ("tpot:50 ttft:", "ttft:"),
])
def test_bad_slo_raises_config_error_naming_the_part(text, part):
    with pytest.raises(ConfigError) as exc:
        slo.parse_slos(text)
    assert f"'{part}'" in str(exc.value)


def test_two_percentiles_of_one_latency_are_two_slos():
    slos = slo.parse_slos("ttft:500 ttft_p99:800")
    assert [s.key for s in slos] == ["ttft_p95", "ttft_p99"]


# --- excess / holds / worst_log_ratio ---------------------------------------------------------

def test_excess_is_relative_to_the_limit_and_reads_the_right_percentile():
    slos = slo.parse_slos("ttft:500 tpot_p99:50 error:1")
    m = {"ttft_ms_p95": 600.0, "ttft_ms_p99": 1.0, "tpot_ms_p99": 25.0, "tpot_ms_p95": 999.0, "error_rate": 0.02}
    assert slo.excess(slos, m) == {"ttft_p95": 0.2, "tpot_p99": -0.5, "error_pct": 1.0}
    assert not slo.holds(slos, m)
    m.update(ttft_ms_p95=500.0, error_rate=0.01)  # exactly at the limit holds
    assert slo.excess(slos, m)["ttft_p95"] == 0.0
    assert slo.holds(slos, m)


def test_missing_or_nan_measurement_is_broken():
    slos = slo.parse_slos("ttft:500")
    assert slo.excess(slos, {}) == {"ttft_p95": math.inf}
    assert slo.excess(slos, {"ttft_ms_p95": math.nan}) == {"ttft_p95": math.inf}
    assert not slo.holds(slos, {"ttft_ms_p95": math.nan})
    assert slo.worst_log_ratio(slos, {"ttft_ms_p95": math.nan}) == math.inf


def test_error_zero_means_any_failure_breaks_it():
    slos = slo.parse_slos("error:0")
    assert slo.holds(slos, {"error_rate": 0.0})
    assert not slo.holds(slos, {"error_rate": 0.001})
    assert slo.holds(slos, {})  # no error_rate: nothing failed


def test_no_slos_always_hold():
    assert slo.holds((), {}) and slo.excess((), {"ttft_ms_p95": 1e9}) == {}


def test_worst_log_ratio_value_and_sign():
    slos = slo.parse_slos("ttft:500 tpot:50")
    m = {"ttft_ms_p95": 250.0, "tpot_ms_p95": 100.0}
    assert slo.worst_log_ratio(slos, m) == pytest.approx(math.log(2))  # the worst one, tpot
    m["tpot_ms_p95"] = 25.0
    assert slo.worst_log_ratio(slos, m) == pytest.approx(math.log(0.5))
    m["ttft_ms_p95"] = 500.0
    assert slo.worst_log_ratio(slos, m) == 0.0


def test_worst_log_ratio_has_the_sign_of_the_worst_excess():
    rng = random.Random(7)
    slos = slo.parse_slos("ttft:500 tpot_p99:50 e2el_p90:2000 error:1")
    slos0 = slo.parse_slos("ttft:500 error:0")
    for _ in range(2000):
        m = {"ttft_ms_p95": rng.choice([0.0, 500.0, rng.uniform(0, 1500)]),
             "tpot_ms_p99": rng.choice([50.0, rng.uniform(0, 150)]),
             "e2el_ms_p90": rng.choice([2000.0, rng.uniform(0, 6000)]),
             "error_rate": rng.choice([0.0, 0.01, rng.uniform(0, 0.05)])}
        for s in (slos, slos0):
            worst, exc = slo.worst_log_ratio(s, m), max(slo.excess(s, m).values())
            assert (worst > 0) == (exc > 0), (m, worst, exc)
            assert (worst < 0) <= slo.holds(s, m)  # a negative score always holds


# --- good_requests (vLLM's per-request goodput) -------------------------------------------------

def rec(i, ttft_ms=None, e2el_ms=None, out=5, ok=True, sent=0.0):
    first = None if ttft_ms is None else sent + ttft_ms / 1000
    end = None if e2el_ms is None else sent + e2el_ms / 1000
    chunks = tuple(t for t in (first, end) if t is not None)
    return RequestRecord(f"r{i}", sent, sent, first, end, chunks, 7, out if ok else 0, out, ok,
                         200 if ok else 500, "" if ok else "boom")


def test_request_values_ttft_tpot_e2el():
    v = slo.request_values(rec(0, 250, 1250, out=5, sent=2.0))
    assert v["ttft"] == pytest.approx(250) and v["e2el"] == pytest.approx(1250)
    assert v["tpot"] == pytest.approx(1000 / 4)
    assert "tpot" not in slo.request_values(rec(1, 250, 250, out=1))
    assert slo.request_values(rec(2, ok=False)) == {}


def test_good_requests_meet_every_latency_slo_on_their_own():
    slos = slo.parse_slos("ttft:500 tpot:100 e2el:1000")
    records = [
        rec(0, 250, 500, out=5),    # ttft 250, tpot 62.5, e2el 500: good
        rec(1, 500, 1000, out=6),   # exactly at every limit (tpot 100): good
        rec(2, 625, 750, out=5),    # ttft over: bad
        rec(3, 250, 875, out=5),    # tpot 156.25 over: bad
        rec(4, 250, 1125, out=50),  # tpot ~17.9 fine, e2el over: bad
        rec(5, 125, 1000, out=1),   # one token: no tpot (vLLM counts it 0): good
        rec(6, ok=False),           # failed: never good
    ]
    assert slo.good_requests(slos, records) == 3
    # per request, not per percentile: the same records with only a ttft SLO
    assert slo.good_requests(slo.parse_slos("ttft:500"), records) == 5
    # error and itl SLOs do not judge single requests
    assert slo.good_requests(slo.parse_slos("itl:1 error:0"), records) == 6
    assert slo.good_requests((), records) == 6


def test_good_requests_does_not_depend_on_the_order_the_slos_are_written():
    records = [rec(0, 400, 800), rec(1, 700, 900), rec(2, 100, 200)]
    a = slo.good_requests(slo.parse_slos("ttft:500 ttft_p99:800"), records)
    b = slo.good_requests(slo.parse_slos("ttft_p99:800 ttft:500"), records)
    assert a == b, f"'ttft:500 ttft_p99:800' counts {a} good requests, the same SLOs reordered {b}"


# --- best_case: the lowest the final percentile can still be ---------------------------------------

def test_best_case_is_the_percentile_with_the_rest_at_zero():
    # p95 of 20 = s[18] + 0.05 (s[19] - s[18]): one 12.5 s TTFT and 19 at 0 ms -> 625 ms
    assert slo.best_case([12500.0], 19, 95) == pytest.approx(625.0)
    assert slo.best_case([100.0, 300.0], 0, 50) == 200.0
    assert slo.best_case([100.0, 300.0], 2, 50) == 50.0  # 0, 0, 100, 300
    assert slo.best_case([], 5, 99) == 0.0


def test_no_completion_of_the_rest_goes_below_best_case():
    """By brute force: whatever the remaining requests take (or if some fail and drop out of
    the percentile), the final percentile is never below best_case, and all-zero reaches it."""
    rng = random.Random(1)
    for _ in range(4000):
        done = [rng.choice([0.0, rng.uniform(0, 1000), rng.uniform(1000, 50000)])
                for _ in range(rng.randint(1, 30))]
        remaining = rng.randint(0, 30)
        q = rng.choice(PCTS)
        floor = slo.best_case(done, remaining, q)
        rest = [rng.choice([None, 0.0, rng.uniform(0, 100), rng.uniform(0, 5000)]) for _ in range(remaining)]
        final = percentile(done + [v for v in rest if v is not None], q)  # None: that request failed
        assert final >= floor - 1e-9 * max(1.0, floor), (done, rest, q, final, floor)
        assert percentile(done + [0.0] * remaining, q) == floor


# --- broken_beyond_repair: judged the way the end of the run judges -----------------------------------

def _records(values_ms, metric, failed=0):
    """ok records whose `metric` (ttft or e2el) has the given values, then `failed` failures."""
    if metric == "ttft":
        recs = [rec(i, v, v + 100, out=5) for i, v in enumerate(values_ms)]
    else:
        recs = [rec(i, min(v, 1.0), v, out=5) for i, v in enumerate(values_ms)]
    return recs + [rec(100 + i, ok=False) for i in range(failed)]


def _best_run_holds(s, records, planned):
    """Does the SLO hold at the end of the run if every remaining request succeeds in 0 ms?
    Judged like a trial: metrics.summarize over the whole run, then slo.holds."""
    rest = [rec(1000 + i, 0.0, 0.0, out=5) for i in range(planned - len(records))]
    metrics = summarize(ReplayResult(tuple(records) + tuple(rest), 1.0))
    return slo.holds((s,), metrics)


def test_p95_of_20_two_misses_barely_over_lose_it_one_does_not():
    slos = slo.parse_slos("ttft:500")
    over, fast = 625.0, 125.0
    recs = _records([fast] * 5 + [over], "ttft")
    assert slo.broken_beyond_repair(slos, recs, 20) is None  # 0..0, 125 x5, 625: p95 = 125 + 0.05 * 500
    recs = _records([fast] * 5 + [over, over], "ttft")
    reason = slo.broken_beyond_repair(slos, recs, 20)
    assert reason and "2 of 20" in reason and "TTFT" in reason
    assert slo.broken_beyond_repair(slo.parse_slos("ttft_p50:500"), recs, 20) is None
    assert slo.broken_beyond_repair(slo.parse_slos("e2el:500"), recs, 20) is not None  # e2el = ttft + 100


def test_one_far_miss_already_loses_a_p95_of_20():
    # one TTFT of 12.5 s: the p95 of 20 is >= 625 ms > 500 ms whatever the other 19 take
    recs = _records([12500.0], "ttft")
    assert slo.broken_beyond_repair(slo.parse_slos("ttft:500"), recs, 20) is not None
    assert slo.broken_beyond_repair(slo.parse_slos("ttft:700"), recs, 20) is None


def test_failures_drop_out_of_the_latency_percentile_as_in_the_final_metrics():
    # metrics.summarize computes latency percentiles over the requests that succeeded
    s = slo.Slo("e2el", 500.0, 95)
    recs = _records([100.0] * 3, "e2el", failed=5)
    assert slo.broken_beyond_repair((s,), recs, 20) is None
    assert _best_run_holds(s, recs, 20)
    # the error SLO is the one that judges failures
    assert slo.broken_beyond_repair((s, slo.Slo("error", 10.0)), recs, 20) is not None


def test_tpot_and_itl_are_not_judged_early():
    slos = slo.parse_slos("tpot:1 itl:1")
    recs = [rec(i, 10, 5000, out=5) for i in range(10)]  # tpot ~1247 ms each
    assert slo.broken_beyond_repair(slos, recs, 20) is None


ERROR_LIMITS = ("0", "0.5", "1", "2.5", "5", "7", "10", "33", "50", "100")


def test_error_slo_is_lost_exactly_when_the_rest_succeeding_cannot_save_it():
    # exact arithmetic: lost iff failed / planned > limit %, even if every remaining request succeeds
    fails, one_ok = [rec(i, ok=False) for i in range(100)], [rec(-1, 100, 200)]
    for text in ERROR_LIMITS:
        slos = (slo.Slo("error", float(text)),)
        for planned in range(1, 101):
            for failed in range(0, planned + 1):
                recs = fails[:failed] + one_ok
                lost = slo.broken_beyond_repair(slos, recs, planned) is not None
                assert lost == (Fraction(100 * failed, planned) > Fraction(text)), (text, planned, failed)


def test_error_slo_holds_at_exactly_its_share_of_failures():
    """A run whose failures are exactly the allowed share holds the SLO, as broken_beyond_repair
    (exact, above) assumes: the end-of-run judgment and the early stop must agree."""
    for text in ERROR_LIMITS:
        slos = (slo.Slo("error", float(text)),)
        for planned in range(1, 101):
            for failed in range(0, planned + 1):
                # as metrics.summarize reports them
                metrics = {"requests": float(planned), "completed": float(planned - failed),
                           "error_rate": (planned - (planned - failed)) / planned}
                truth = Fraction(100 * failed, planned) <= Fraction(text)
                assert slo.holds(slos, metrics) == truth, (
                    f"error:{text} with {failed} of {planned} requests failed: holds() says "
                    f"{not truth}, excess {slo.excess(slos, metrics)}")

def _random_partial(rng, limit):
    """A run cut somewhere before its end (stop_when is only asked while requests remain)."""
    planned = rng.randint(2, 60)
    done = rng.randint(1, planned - 1)
    kind = rng.random()
    values = []
    for _ in range(done):
        r = rng.random()
        if kind < 0.3:  # misses barely over the limit
            v = limit * 1.001 if r < 0.3 else rng.uniform(0, limit)
        elif kind < 0.6:  # misses far over the limit (an overloaded server)
            v = rng.uniform(10 * limit, 100 * limit) if r < 0.2 else rng.uniform(0, limit)
        else:
            v = rng.choice([limit, rng.uniform(0, 3 * limit)])
        values.append(v)
    failed = rng.choice([0, 0, 0, rng.randint(0, max(0, done // 3))])
    return planned, values[:done - failed], failed


def test_broken_exactly_when_no_completion_can_rescue_it():
    """Both directions, for ttft and e2el: never 'broken' while the remaining requests could still
    rescue the SLO (that would discard a good run), and 'broken' as soon as none can (else the
    early stop wastes the rest of the run). Judged as a trial would: the best completion of the
    rest through metrics.summarize and slo.holds."""
    rng = random.Random(3)
    limit = 500.0
    lost = 0
    for _ in range(6000):
        planned, values, failed = _random_partial(rng, limit)
        q, metric = rng.choice(PCTS), rng.choice(("ttft", "e2el"))
        recs = _records(values, metric, failed)
        s = slo.Slo(metric, limit, q)
        rescuable = _best_run_holds(s, recs, planned)
        lost += not rescuable
        assert bool(slo.broken_beyond_repair((s,), recs, planned)) == (not rescuable), (
            f"{len(recs)} of {planned} done, p{q} {metric}, failed {failed}: rescuable={rescuable}; "
            f"values {sorted(values)[-5:]}")
    assert 300 < lost < 5700  # both outcomes were exercised
