"""The step probe: its groups decode at batches that differ, from prompts the prefix cache cannot
serve, and its timings alone tell a step's fixed cost from its cost per decoding sequence."""

import random

import pytest

from optimizer.twin import probe
from optimizer.twin.fit import fit
from optimizer.twin.step_cost import TERMS, LinearStepCost
from optimizer.workload.base import Request, Workload

TRUTH = LinearStepCost((0.003, 0.00004, 0.00002, 0.0006, 0.0002, 0.0001, 0.00007, 0.00003, 0.0001, 0.00005), 0.003)


def _workload() -> Workload:
    rng = random.Random(1)
    reqs = tuple(Request(f"r{i}", tuple(rng.randrange(100, 3000) for _ in range(rng.randint(200, 600))), 64, 0.0)
                 for i in range(12))
    return Workload("chat", reqs, (), 8)


def test_the_groups_decode_one_a_quarter_and_all_of_max_num_seqs_at_the_workloads_prompt_then_a_longer_one():
    wl = _workload()
    groups = probe.build(wl, 16, 4096)
    assert [len(g) for g in groups] == [1, 4, 16, 4]
    median = sorted(len(r.prompt_token_ids) for r in wl.requests)[len(wl.requests) // 2]
    # the batches at the workload's median prompt; the long group at 4x it
    assert [len(g[0].prompt_token_ids) for g in groups] == [median, median, median, 4 * median]
    assert all(r.offset_s == 0.0 and r.max_tokens > 1 for g in groups for r in g)
    pool = {t for r in wl.requests for t in r.prompt_token_ids}
    prompts = [r.prompt_token_ids for g in groups for r in g]
    assert all(set(p) <= pool for p in prompts)  # the model's own token ids, no tokenizer
    assert len({p[:16] for p in prompts}) == len(prompts)  # no first block shared: no prefix-cache hit
    # a small server: batches within its max-num-seqs, the long prompt within half its max-model-len
    small = probe.build(wl, 2, 512)
    assert [len(g) for g in small] == [1, 2, 2] and len(small[-1][0].prompt_token_ids) <= 256
    assert probe.batches(1) == [1] and probe.batches(1024) == [1, 16, 64]
    assert probe.build(Workload("empty", (), (), None), 16, 4096) == ()


def _probed(server, groups, cost):
    rows = []
    for g in groups:
        recs = {r.id: r for r in server.run(g, None, cost).result.records}
        rows.append([[recs[q.id].sent_s, recs[q.id].first_chunk_s, recs[q.id].end_s, len(q.prompt_token_ids),
                      recs[q.id].output_tokens, recs[q.id].ok] for q in g])
    return rows


def test_the_probe_alone_tells_a_steps_fixed_cost_from_its_per_sequence_cost(twin):
    """Timings the twin made with known costs: fitted on the probe's groups alone, the fixed and the
    per-sequence cost of a decode step come back, each within 10%. A failed group is left out."""
    server = twin("--max-num-seqs", "16")
    groups = probe.build(_workload(), 16, 4096)
    rows = _probed(server, groups, TRUTH)
    runs = probe.measured_runs("base", server, groups, rows)
    assert [r.label for r in runs] == [f"base probe {i}" for i in range(4)]
    got = dict(zip(TERMS, fit(runs).cost.coefficients))
    truth = dict(zip(TERMS, TRUTH.coefficients))
    for term in ("step_s", "decode_seq_s"):
        assert got[term] == pytest.approx(truth[term], rel=0.1), (term, got[term], truth[term])
    # The lone request's first token is fitted too (it waits for no other request's intake): it
    # tells the intake apart from the steps; the bursts' first tokens are not fitted.
    assert [r.spans_only for r in runs] == [False, True, True, True]
    assert fit(runs).cost.intake_s == pytest.approx(TRUTH.intake_s, rel=0.1)
    rows[1][2][5] = False  # one request of the 4-sequence group failed
    assert [r.label for r in probe.measured_runs("base", server, groups, rows)] == ["base probe 0", "base probe 2",
                                                                                  "base probe 3"]


def test_the_baselines_stored_probe_calibrates_the_studys_twin(tmp_path, tiny_model):
    """The driver's writer keeps the probe beside the trial (step_probe.json); the study's twin fits
    the baseline's workload run and each probe group, and names how many groups in its cache key."""
    import json

    from optimizer.config.schema import build_config
    from optimizer.driver.plan import prepare
    from optimizer.driver.store.trial_files import store_trial
    from optimizer.trial.spec import TrialResult
    from optimizer.twin.from_study import calibrate, stored_runs
    from optimizer.twin.server import TwinServer

    plan = prepare(build_config({
        "study_name": "probed", "storage": f"sqlite:///{tmp_path / 'trials.db'}", "artifacts_dir": str(tmp_path / "a"),
        "model": {"path": str(tiny_model), "load_format": "dummy", "dtype": "bfloat16"},
        "baseline": {"max-num-seqs": 8}, "space": {"max-num-seqs": {"low": 1, "high": 16}},
        "engine": {"extra_args": ["--kv-cache-memory-bytes", str(1 << 30), "--max-model-len", "4096"]},
        "workload": {"requests": 24, "warmup_requests": 0, "long_share": 0.0, "short_input": [64, 256],
                     "output": [32, 64], "arrival": {"process": "closed", "concurrency": 12}}}))
    params = {"max-num-seqs": 8}
    server = TwinServer.from_flags(plan.model, plan.server_args(params), plan.device, "")
    sim = server.run(plan.workload.requests, plan.workload.concurrency, TRUTH)
    groups = probe.for_server(plan.workload, plan.server_args(params), plan.model.max_positions)
    assert [len(g) for g in groups] == [1, 2, 8, 4]
    result = TrialResult(0, None, {"request_throughput": 1.0}, records=sim.result.records, host="here",
                         step_probe=tuple(_probed(server, groups, TRUTH)))
    d = plan.artifacts / "trial-0"
    d.mkdir(parents=True)
    assert store_trial(d, params, result, "here") is None
    assert len(json.loads((d / "step_probe.json").read_text())["groups"]) == 4
    assert len(stored_runs(plan.artifacts)[0].probe) == 4
    cal = calibrate(plan)
    assert json.loads((plan.artifacts / "twin.json").read_text())["key"]["probes"] == 4
    assert [r.number for r in cal.runs if r.probe] == [0]  # `simulate` names it: "and the step probe of trial(s) 0"
    got, truth = dict(zip(TERMS, cal.cost.coefficients)), dict(zip(TERMS, TRUTH.coefficients))
    for term in ("step_s", "decode_seq_s"):
        assert got[term] == pytest.approx(truth[term], rel=0.1), (term, got[term], truth[term])
