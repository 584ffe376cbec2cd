"""trial/early_stop.py: the driver's early-stop rules on the partial measurements a trial sends
(trial/stages.partial_metrics), and the best feasible value so far from an Optuna study.

The latency rule is checked against metrics.percentile by brute force: a stop must be
provable (no completion of the remaining requests reaches the best), and a go-on must be
justified (the best completion would beat or tie it)."""

import math
import random

import optuna
import pytest

from objectives import get_objective
from optimizer.measure import slo
from optimizer.measure.metrics import percentile, summarize
from optimizer.measure.replay import ReplayResult, RequestRecord
from optimizer.verdict.trials import best_feasible
from optimizer.trial import early_stop as earlystop
from optimizer.trial.stages import partial_metrics
from optimizer.workload import Request

PCTS = (50, 90, 95, 99)


def req(i, prompt=7, out=5):
    return Request(f"r{i}", tuple(range(3, 3 + prompt)), out, 0.1 * i)


def rec(i, sent, ttft_s, e2el_s, out=5, prompt=7, ok=True):
    if not ok:
        return RequestRecord(f"r{i}", sent, sent, None, None, (), prompt, 0, out, False, 500, "boom")
    return RequestRecord(f"r{i}", sent, sent, sent + ttft_s, sent + e2el_s, (sent + ttft_s, sent + e2el_s),
                         prompt, out, out, True, 200)


LATENCY = get_objective("latency", "ttft_p95")
E2EL = get_objective("latency", "e2el_p99")
TPOT = get_objective("latency", "tpot_p95")
OUT_TPUT = get_objective("throughput", "output_throughput")
REQ_TPUT = get_objective("throughput", "request_throughput")
TOK_TPUT = get_objective("throughput", "total_token_throughput")
GOODPUT = get_objective("goodput", None, slo.parse_slos("ttft:500"))
PARETO = get_objective("pareto")


# --- the payload ---------------------------------------------------------------------------------

def test_partial_payload_from_records():
    planned = tuple(req(i, prompt=7, out=5) for i in range(10))
    finished = [rec(0, 1.0, 0.25, 0.5), rec(1, 1.5, 0.125, 2.0), rec(2, 1.25, 0, 0, ok=False)]
    p = partial_metrics(finished, planned)
    assert (p["finished"], p["planned"], p["failed"]) == (3, 10, 1)
    assert p["elapsed_s"] == pytest.approx(3.5 - 1.0)  # first send -> last end so far
    assert p["output_tokens"] == 10 and p["total_tokens"] == 10 + 21
    assert p["planned_output_tokens"] == 50 and p["planned_total_tokens"] == 50 + 70
    assert p["ttft"] == pytest.approx([250, 125]) and p["e2el"] == pytest.approx([500, 2000])
    assert p["tpot"] == pytest.approx([250 / 4, 1875 / 4])


def test_intermediate_values():
    planned = tuple(req(i) for i in range(10))
    finished = [rec(i, 0.5 * i, 0.1 * (i + 1), 0.2 * (i + 1)) for i in range(4)]
    p = partial_metrics(finished, planned)
    assert earlystop.intermediate(LATENCY, p) == pytest.approx(percentile(p["ttft"], 95))
    assert earlystop.intermediate(E2EL, p) == pytest.approx(percentile(p["e2el"], 99))
    assert earlystop.intermediate(TPOT, p) == pytest.approx(percentile(p["tpot"], 95))
    elapsed = 1.5 + 0.8  # last end (r3: 1.5 + 0.8) - first send (0)
    assert p["elapsed_s"] == pytest.approx(elapsed)
    assert earlystop.intermediate(OUT_TPUT, p) == pytest.approx(20 / elapsed)
    assert earlystop.intermediate(REQ_TPUT, p) == pytest.approx(4 / elapsed)
    assert earlystop.intermediate(TOK_TPUT, p) == pytest.approx((20 + 28) / elapsed)
    assert earlystop.intermediate(GOODPUT, {"capacity_rps": 12.5}) == 12.5
    assert earlystop.intermediate(GOODPUT, p) is None
    assert earlystop.intermediate(PARETO, p) is None
    assert earlystop.intermediate(LATENCY, dict(p, ttft=[])) is None


# --- latency ---------------------------------------------------------------------------------------

def test_latency_stop_threshold_on_a_p95_of_20():
    planned = tuple(req(i) for i in range(20))  # p95 of 20 = s[18] + 0.05 (s[19] - s[18])
    fast = [rec(i, 0, 0.1, 0.2) for i in range(5)]
    one = fast + [rec(5, 0, 0.4, 0.5)]
    two = one + [rec(6, 0, 0.4, 0.5)]
    # one miss: 0 x14, 100 x5, 400 -> best case 100 + 0.05 * 300 = 115 ms, it may still win
    assert earlystop.verdict(LATENCY, partial_metrics(one, planned), best=300.0) == ""
    # two misses: the best case is 400 ms > 300 ms
    reason = earlystop.verdict(LATENCY, partial_metrics(two, planned), best=300.0)
    assert "ttft_p95" in reason and "400.0" in reason
    assert earlystop.verdict(LATENCY, partial_metrics(two, planned), best=400.0) == ""  # it could tie
    # one far miss is enough: 0 x19 and 12.5 s -> 625 ms
    far = [rec(0, 0, 12.5, 12.6)]
    assert earlystop.verdict(LATENCY, partial_metrics(far, planned), best=600.0) != ""
    assert earlystop.verdict(LATENCY, partial_metrics(far, planned), best=630.0) == ""
    # tpot/itl are not judged early
    assert earlystop.verdict(TPOT, partial_metrics(two, planned), best=0.001) == ""


def _latency_case(rng):
    """A replay cut somewhere before its end, some requests slow, some failed."""
    planned_n = rng.randint(2, 60)
    done = rng.randint(1, planned_n - 1)
    best = 500.0
    kind = rng.random()
    finished = []
    for i in range(done):
        r = rng.random()
        if kind < 0.3:
            v = best * 1.001 if r < 0.3 else rng.uniform(0, best)
        elif kind < 0.6:  # far over the best (a slow configuration)
            v = rng.uniform(10 * best, 100 * best) if r < 0.2 else rng.uniform(0, best)
        else:
            v = rng.choice([best, rng.uniform(0, 3 * best)])
        failed = rng.random() < 0.05
        finished.append(rec(i, 0.0, v / 1000, v / 1000 + 0.1, ok=not failed))
    planned = tuple(req(i) for i in range(planned_n))
    return planned, finished, best


def _best_final(finished, planned, objective):
    """The objective's value if every remaining request succeeded in 0 ms: metrics.summarize
    over the whole run, read as the objective reads it (the best any completion can do)."""
    rest = [rec(1000 + i, 0.0, 0.0, 0.0) for i in range(len(planned) - len(finished))]
    metrics = summarize(ReplayResult(tuple(finished) + tuple(rest), 1.0))
    return objective.score(metrics)


def _objectives(rng):
    q = rng.choice(PCTS)
    return get_objective("latency", f"{rng.choice(('ttft', 'e2el'))}_p{q}")


def test_latency_stops_exactly_when_the_best_completion_cannot_beat_the_best():
    """Both directions: a stop is provable (even the best completion ends worse than the best),
    and 'go on' means the best completion would still beat or tie it."""
    rng = random.Random(11)
    stops = 0
    for _ in range(6000):
        planned, finished, best = _latency_case(rng)
        obj = _objectives(rng)
        final = _best_final(finished, planned, obj)
        stopped = bool(earlystop.verdict(obj, partial_metrics(finished, planned), best))
        stops += stopped
        assert stopped == (final > best), (
            f"{len(finished)} of {len(planned)} done: even if the rest took 0 ms the final "
            f"{obj.metric} would be {final:.1f} vs best {best}; verdict stop={stopped}")
    assert 300 < stops < 5700  # both outcomes were exercised


# --- throughput --------------------------------------------------------------------------------------

def test_throughput_ceiling_is_planned_tokens_over_elapsed():
    planned = tuple(req(i, out=5) for i in range(10))  # 50 output tokens planned
    finished = [rec(0, 0.0, 0.5, 1.0), rec(1, 0.5, 0.5, 2.0)]  # elapsed 2.5 s: ceiling 20 tok/s
    p = partial_metrics(finished, planned)
    assert p["elapsed_s"] == 2.5
    reason = earlystop.verdict(OUT_TPUT, p, best=20.5)
    assert reason and "20.0" in reason
    assert earlystop.verdict(OUT_TPUT, p, best=20.0) == ""  # it could still tie
    assert earlystop.verdict(OUT_TPUT, p, best=19.0) == ""
    assert earlystop.verdict(REQ_TPUT, p, best=4.01) != ""  # 10 requests / 2.5 s = 4 req/s
    assert earlystop.verdict(REQ_TPUT, p, best=4.0) == ""
    assert earlystop.verdict(TOK_TPUT, p, best=(50 + 70) / 2.5 + 0.01) != ""
    assert earlystop.verdict(TOK_TPUT, p, best=(50 + 70) / 2.5) == ""


def test_throughput_stop_never_discards_a_winner():
    """Random full runs: for every prefix of finished requests (in completion order), a stop
    against `best` means the full run's value is below `best`."""
    rng = random.Random(5)
    stops = 0
    for _ in range(300):
        n = rng.randint(2, 30)
        planned = tuple(req(i, prompt=rng.randint(1, 50), out=rng.randint(1, 40)) for i in range(n))
        full = []
        for i, r in enumerate(planned):
            sent = rng.uniform(0, 3)
            ttft = rng.uniform(0.01, 1)
            full.append(rec(i, sent, ttft, ttft + rng.uniform(0, 2), out=r.max_tokens,
                            prompt=len(r.prompt_token_ids)))
        first = min(r.sent_s for r in full)
        final = summarize(ReplayResult(tuple(full), max(r.end_s for r in full) - first))
        by_end = sorted(full, key=lambda r: r.end_s)
        for obj in (OUT_TPUT, REQ_TPUT, TOK_TPUT):
            value = final[obj.metric]
            for k in range(1, n):
                p = partial_metrics(by_end[:k], planned)
                for best in (value * 0.99, value, value * 1.0001, value * 1.5):
                    if earlystop.verdict(obj, p, best):
                        stops += 1
                        assert value < best, (obj.metric, k, n, value, best)
    assert stops > 100


# --- goodput, pareto, no best -------------------------------------------------------------------------

def test_goodput_capacity_below_best_stops():
    assert "below the best" in earlystop.verdict(GOODPUT, {"capacity_rps": 4.0}, best=5.0)
    assert earlystop.verdict(GOODPUT, {"capacity_rps": 5.0}, best=5.0) == ""
    assert earlystop.verdict(GOODPUT, {"capacity_rps": 9.0}, best=5.0) == ""
    assert earlystop.verdict(GOODPUT, {}, best=5.0) == ""


def test_pareto_and_no_best_never_stop():
    planned = tuple(req(i) for i in range(10))
    slow = [rec(i, 0, 10.0, 20.0) for i in range(9)]  # every request far slower than any best
    p = partial_metrics(slow, planned)
    assert earlystop.verdict(LATENCY, p, best=1.0) != ""  # the payload would stop a latency study
    assert earlystop.verdict(OUT_TPUT, p, best=1e6) != ""
    assert earlystop.verdict(PARETO, p, best=1.0) == ""
    for obj in (LATENCY, OUT_TPUT, GOODPUT, PARETO):
        assert earlystop.verdict(obj, dict(p, capacity_rps=0.1), best=None) == ""
        assert earlystop.verdict(obj, dict(p, capacity_rps=0.1), best=math.nan) == ""


# --- best_feasible ------------------------------------------------------------------------------------

def _study(direction, trials):
    """trials: (value, constraints or None, state)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction=direction)
    for value, constraints, state in trials:
        t = study.ask()
        for k, v in (constraints or {}).items():
            t.set_constraint(k, v)
        if state == "pruned":
            t.report(value, 0)
            study.tell(t, state=optuna.trial.TrialState.PRUNED)
        elif state == "fail":
            study.tell(t, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(t, value)
    return study


def test_best_feasible_minimize_ignores_infeasible_and_unfinished():
    study = _study("minimize", [
        (300.0, {"ttft_p95": -0.1}, "complete"),
        (100.0, {"ttft_p95": 0.5}, "complete"),   # better but misses its SLO
        (250.0, {"ttft_p95": 0.0, "tpot_p95": -1.0}, "complete"),  # exactly at the limit: feasible
        (200.0, {"ttft_p95": -0.5, "tpot_p95": 0.01}, "complete"),  # one constraint broken
        (50.0, None, "pruned"),  # pruned trials carry their last reported value
        (0.0, None, "fail"),
    ])
    assert best_feasible(study, LATENCY) == 250.0


def test_best_feasible_maximize_and_without_constraints():
    study = _study("maximize", [(30.0, {"error_pct": -1.0}, "complete"), (100.0, {"error_pct": 2.0}, "complete"),
                                (20.0, None, "complete")])
    assert best_feasible(study, OUT_TPUT) == 30.0
    study = _study("maximize", [(30.0, None, "complete"), (45.0, None, "complete")])
    assert best_feasible(study, OUT_TPUT) == 45.0


def test_best_feasible_none_when_nothing_feasible_or_pareto():
    study = _study("minimize", [(100.0, {"ttft_p95": 0.5}, "complete"), (10.0, None, "pruned")])
    assert best_feasible(study, LATENCY) is None
    assert best_feasible(_study("minimize", []), LATENCY) is None
    multi = optuna.create_study(directions=["maximize", "minimize"])
    t = multi.ask()
    multi.tell(t, [1.0, 2.0])
    assert best_feasible(multi, PARETO) is None


def test_margin_spares_a_trial_within_the_noise_of_the_best():
    from objectives import get_objective
    from optimizer.trial import early_stop as earlystop

    lat = get_objective("latency", "ttft_p95")
    payload = {"ttft": [700.0] * 12, "planned": 48, "finished": 12, "failed": 0}  # best case 700 ms
    assert earlystop.verdict(lat, payload, best=650.0)  # exact: 700 > 650, cannot win
    assert earlystop.verdict(lat, payload, best=650.0, margin=0.1) == ""  # 700 < 715: within the noise
    assert earlystop.verdict(lat, payload, best=600.0, margin=0.1)  # 700 > 660
    thr = get_objective("throughput")
    slow = {"planned_output_tokens": 1000, "elapsed_s": 1.0, "finished": 3, "planned": 10}  # ceiling 1000 tok/s
    assert earlystop.verdict(thr, slow, best=1050.0) and earlystop.verdict(thr, slow, best=1050.0, margin=0.1) == ""


# --- the trial judges its own stages (trial/stages.stopper) -----------------------------------------------

class _SilentDriver:
    """A driver whose verdicts never arrive (Ray delivered them 3-30 s late on a saturated
    2-core machine), recording the checkpoints it was sent."""

    def __init__(self):
        self.sent = []

    def checkpoint(self, step, payload):
        self.sent.append(step)

    def stop_reason(self):
        return ""


def _spec_for(best, judge=LATENCY, margin=0.0):
    from optimizer.trial.spec import TrialSpec
    from optimizer.workload import Workload

    planned = tuple(req(i) for i in range(20))
    workload = Workload(name="t", requests=planned, warmup=(), concurrency=4)
    return TrialSpec(number=3, model="m", params={}, vllm_args=(), workload=workload, log_path="x", stages=4,
                     stop_on_slo=False, judge=judge, best=best, margin=margin)


def test_trial_stops_at_the_first_hopeless_stage_without_the_driver():
    from optimizer.trial.stages import stopper

    driver = _SilentDriver()
    stop = stopper(_spec_for(best=100.0), driver)
    finished = [rec(i, 0.0, 2.0, 3.0) for i in range(5)]  # 5 of 20 at 2000 ms: p95 >= 2000 whatever follows
    assert stop(finished[:4]) == ""  # no stage yet (every 5)
    reason = stop(finished)
    assert reason.startswith("trial: even if the other 15 of 20 requests took 0 ms") and "100.00 ms" in reason
    assert driver.sent == [1]  # the driver still hears the stage (Optuna's intermediate value)


def test_trial_goes_on_when_it_can_still_win_or_has_nothing_to_judge():
    from optimizer.trial.stages import stopper

    finished = [rec(i, 0.0, 0.05, 0.1) for i in range(5)]  # 50 ms so far, best 100 ms
    assert stopper(_spec_for(best=100.0), _SilentDriver())(finished) == ""
    slow = [rec(i, 0.0, 2.0, 3.0) for i in range(5)]
    assert stopper(_spec_for(best=None, judge=None), _SilentDriver())(slow) == ""  # the baseline: no best yet
    assert stopper(_spec_for(best=1900.0, margin=0.1), _SilentDriver())(slow) == ""  # within the noise margin

