"""fleet/topologies.py: devices needed against the peak, one row per topology (its best trial), fewest
first; a topology pruned before its boot is listed with why; other objectives get no table."""

import optuna

from objectives import get_objective
from optimizer.config.schema import FleetSpec
from optimizer.fleet import topologies
from optimizer.measure.slo import parse_slos

FLEET = get_objective("fleet", slos=parse_slos("ttft:500"), fleet=FleetSpec(peak_qps=20, headroom=0.2, budget=5))


def _trial(number, tp, dp, rate=None, ttft=200.0, evidence=""):
    params = {"tensor-parallel-size": tp, "data-parallel-size": dp}
    dist = {k: optuna.distributions.CategoricalDistribution([1, 2]) for k in params}
    attrs = {"vllm_args": ["--max-num-seqs", "16"]}
    if rate is None:
        attrs.update(evidence=evidence, failure_kind="invalid_config", precheck="too_big")
        return optuna.trial.create_trial(params=params, distributions=dist, user_attrs=attrs,
                                         state=optuna.trial.TrialState.PRUNED)
    attrs["metrics"] = {"goodput_rate": rate, "devices": float(tp * dp), "ttft_ms_p95": ttft}
    return optuna.trial.create_trial(params=params, distributions=dist, user_attrs=attrs,
                                     value=FLEET.score(attrs["metrics"]))


def test_one_row_per_topology_its_best_trial_fewest_devices_first():
    trials = [_trial(0, 1, 1, rate=5.0), _trial(1, 2, 1, rate=7.0), _trial(2, 1, 2, rate=12.0),
              _trial(3, 1, 1, rate=6.5, ttft=150.0),
              _trial(4, 2, 2, evidence="predicted, not booted: TP 2 x DP 2 runs 4 ranks, one CPU each; the "
                                       "largest node has 2 CPUs")]
    for i, t in enumerate(trials):
        t.number = i
    rows = topologies.rows(trials, FLEET)
    assert [r[0] for r in rows] == ["1 engine", "DP 2", "TP 2", "TP 2 x DP 2"]
    one, dp2, tp2, skipped = rows
    assert one == ["1 engine", "1", "6.50", "150", "4", "4", "3"]  # trial 3: 6.5 x 0.8 = 5.2 req/s, 4 replicas
    assert dp2 == ["DP 2", "2", "12.00", "200", "3", "6 (over the budget of 5)", "2"]
    assert tp2[4:6] == ["4", "8 (over the budget of 5)"]
    assert skipped[-2] == "not run: TP 2 x DP 2 runs 4 ranks, one CPU each; the largest node has 2 CPUs"


def test_a_replica_with_no_goodput_and_other_objectives():
    none = _trial(0, 1, 1, rate=0.0)
    assert topologies.rows([none], FLEET)[0][4:6] == ["-", "none carries it (no rate held the SLOs)"]
    assert topologies.rows([none], get_objective("goodput", slos=parse_slos("ttft:500"))) == []
    per_device = get_objective("fleet", slos=parse_slos("ttft:500"), fleet=FleetSpec())
    assert topologies.rows([_trial(0, 2, 1, rate=8.0)], per_device)[0][4:6] == ["-", "-"]


def test_a_topology_no_node_holds_is_counted_apart_from_the_kv_precheck():
    from optimizer.report.summary import savings_text
    from optimizer.verdict.trials import savings

    study = optuna.create_study()
    study.add_trial(_trial(0, 1, 1, rate=5.0))
    study.add_trial(_trial(1, 2, 2, evidence="predicted, not booted: TP 2 x DP 2 runs 4 ranks, one CPU each"))
    sv = savings(study)
    assert (sv["boots_avoided"], sv["too_big"]) == (0, 1)
    assert savings_text(sv).startswith("Saved: 0 boot(s) avoided by the KV precheck; 1 by a topology no node holds; ")
