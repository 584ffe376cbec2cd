"""report/written.py: the written report (report.md / report.html, best.yaml, pictures) of a real study."""

import importlib.util
import json
import re
import sys
import types
from dataclasses import asdict, dataclass
from pathlib import Path

import optuna
import pytest
import yaml

from objectives import LatencyObjective, ParetoObjective, ThroughputObjective
from optimizer.measure.replay import RequestRecord
from optimizer.measure.noise import pooled
from optimizer.measure.slo import parse_slos
from optimizer.report.pictures import TOO_FEW, log_axis, non_dominated, read_ttft_ms
from optimizer.deploy.serve import serve_command, serve_yaml
from optimizer.report.written import write_report
from optimizer.verdict.confirmed import decide

MODEL = "/models/tiny"
BEST_ARGS = ["--max-num-seqs", "16", "--gpu-memory-utilization", "0.3", "--max-model-len", "2048",
             "--kv-cache-dtype", "fp8", "--no-enable-prefix-caching", "--load-format", "dummy"]
DIST = {"max-num-seqs": optuna.distributions.IntDistribution(4, 64, log=True),
        "gpu-memory-utilization": optuna.distributions.FloatDistribution(0.2, 0.5)}
LONG_EVIDENCE = ("ValueError: The model's max seq len (2048) is larger than the maximum number of tokens that can be "
                 "stored in KV cache (1024). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` "
                 "when initializing the engine. " * 2)
PNG = b"\x89PNG\r\n\x1a\n"
MAX, MIN = optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE


@dataclass(frozen=True)
class StubDiagnosis:
    trial: int
    kind: str
    cause: str
    remedy: str
    evidence: str


def _stub_module(extra=()):
    def diagnose_study(study):
        out = [StubDiagnosis(t.number, t.user_attrs.get("failure_kind", ""), f"stub cause of {t.number}",
                             f"stub remedy of {t.number}", t.user_attrs.get("evidence", ""))
               for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.PRUNED]
        return out + list(extra)
    mod = types.ModuleType("optimizer.report.diagnosis")
    mod.Diagnosis, mod.diagnose_study = StubDiagnosis, diagnose_study
    return mod


@pytest.fixture(autouse=True)
def diagnosis(monkeypatch):
    """The real optimizer.report.diagnosis once it exists; until then a stub with its interface."""
    if importlib.util.find_spec("optimizer.report.diagnosis") is None:
        monkeypatch.setitem(sys.modules, "optimizer.report.diagnosis", _stub_module())


def _args(seqs: int, mem: float) -> list[str]:
    return ["--max-num-seqs", str(seqs), "--gpu-memory-utilization", f"{mem:.4g}", "--load-format", "dummy"]


def _metrics(ttft: float, throughput: float) -> dict:
    return {"ttft_ms_p95": ttft, "ttft_ms_p50": ttft / 2, "tpot_ms_p95": 21.5, "output_throughput": throughput,
            "completed": 40.0, "error_rate": 0.0}


def _complete(value, args, metrics, baseline=False, params=None, constraints=None):
    attrs = {"vllm_args": args, "metrics": metrics, **({"baseline": True} if baseline else {})}
    params = params if params is not None else {"max-num-seqs": int(args[1]), "gpu-memory-utilization": float(args[3])}
    value, values = (None, value) if isinstance(value, list) else (value, None)
    return optuna.trial.create_trial(value=value, values=values, params=params, user_attrs=attrs,
                                     distributions={k: DIST[k] for k in params}, constraints=constraints)


def _write_requests(artifacts: Path, number: int, ttfts_ms: list[float]) -> None:
    """requests.jsonl as artifacts.store_trial writes it: one RequestRecord per line."""
    lines = []
    for i, ttft in enumerate(ttfts_ms):
        sent = 0.1 * i
        first = sent + ttft / 1000
        r = RequestRecord(f"r{i}", sent, sent, first, first + 0.5, (first, first + 0.5), 32, 16, 16, True, 200)
        lines.append(json.dumps(asdict(r), sort_keys=True))
    lines.append(json.dumps(asdict(RequestRecord("bad", 9.0, 9.0, None, None, (), 32, 0, 16, False, 400, "too long"))))
    (artifacts / f"trial-{number}").mkdir(parents=True, exist_ok=True)
    (artifacts / f"trial-{number}" / "requests.jsonl").write_text("\n".join(lines) + "\n")


def latency_study(tmp_path: Path, confirmation: dict | None = None) -> optuna.Study:
    """Minimize p95 TTFT with a tpot SLO: baseline 250 ms, best trial 1 at 120 ms (trial 4 is faster
    but misses the SLO), one trial pruned at start, one failed on infrastructure."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/t.db", study_name="lat", direction="minimize")
    study.add_trial(_complete(250.0, ["--load-format", "dummy"], _metrics(250.0, 300.0), baseline=True, params={},
                              constraints={"tpot_p95": -0.5}))
    study.add_trial(_complete(120.0, BEST_ARGS, _metrics(120.0, 420.0), constraints={"tpot_p95": -0.2}))
    study.add_trial(_complete(180.0, _args(32, 0.4), _metrics(180.0, 500.0), constraints={"tpot_p95": -0.1}))
    study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.PRUNED, params={"max-num-seqs": 64, "gpu-memory-utilization": 0.21},
        distributions=DIST, user_attrs={"vllm_args": _args(64, 0.21), "failure_kind": "kv_too_small",
                                        "evidence": LONG_EVIDENCE, "remedy": "lower max-model-len"}))
    study.add_trial(_complete(90.0, _args(8, 0.45), _metrics(90.0, 250.0), constraints={"tpot_p95": 0.4}))
    study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.FAIL, user_attrs={"failure_kind": "infra", "evidence": "ray lost the task",
                                                        "remedy": "queued again"}))
    study.add_trial(_complete(150.0, _args(24, 0.35), _metrics(150.0, 460.0), constraints={"tpot_p95": -0.3}))
    if confirmation is not None:
        study.set_user_attr("confirmation", confirmation)
    return study


@pytest.fixture
def study_dir(tmp_path):
    artifacts = tmp_path / "artifacts" / "lat"
    _write_requests(artifacts, 0, [200.0 + 5 * i for i in range(20)])
    _write_requests(artifacts, 1, [80.0 + 2 * i for i in range(20)])
    return artifacts


def _objective():
    return LatencyObjective("ttft_p95", parse_slos("tpot:50"))


def _markdown(study, study_dir, out: Path) -> str:
    return write_report(study, MODEL, study_dir, _objective(), out).markdown.read_text()


def test_writes_report_best_yaml_and_pictures(tmp_path, study_dir):
    study = latency_study(tmp_path)
    files = write_report(study, MODEL, study_dir, _objective(), tmp_path / "out")
    assert set(files.pictures) == {"tradeoff", "ttft"}  # 5 completed trials: too few for a fitted importance
    for png, page in files.pictures.values():
        assert png.read_bytes().startswith(PNG) and png.stat().st_size > 1000
        text = page.read_text()
        assert "<html" in text and 'src="plotly.min.js"' in text  # offline: the library sits beside it
    assert (tmp_path / "out" / "plotly.min.js").stat().st_size > 1_000_000
    md = files.markdown.read_text()
    assert "Recommended (best single run): trial 1, ttft_p95 = 120.00 ms (one run)" in md
    assert "Baseline: trial 0, ttft_p95 = 250.00 ms" in md
    assert "Gain over the baseline: 2.08x (one run each side: no interval)" in md
    assert serve_command(MODEL, BEST_ARGS) in md and f"vllm serve {MODEL} --config best.yaml" in md
    page = files.html.read_text()
    assert page.startswith("<!DOCTYPE html>") and '<img src="tradeoff.png"' in page and "2.08x" in page
    # sections in the order of the brief
    heads = ["## Result", "## Deploy", "## Top configurations", "## Pictures", "## Failures", "## Savings"]
    assert [md.index(h) for h in heads] == sorted(md.index(h) for h in heads)
    assert "## Sensitivity" not in md


def test_best_yaml_round_trips_to_the_best_trials_flags(tmp_path, study_dir):
    files = write_report(latency_study(tmp_path), MODEL, study_dir, _objective(), tmp_path / "out")
    config = yaml.safe_load(files.best_yaml.read_text())
    assert config == serve_yaml(BEST_ARGS)
    assert config["max-num-seqs"] == 16 and config["gpu-memory-utilization"] == 0.3
    flags = []  # flattened as vLLM's load_config_file does
    for key, value in config.items():
        flags += [f"--{key}"] if value is True else [f"--{key}", str(value)]
    assert flags == BEST_ARGS


def test_top_table_holds_feasible_complete_trials_best_first(tmp_path, study_dir):
    md = _markdown(latency_study(tmp_path), study_dir, tmp_path / "out")
    top = md[md.index("## Top configurations"):md.index("## Pictures")]
    rows = [line for line in top.splitlines() if line.startswith("| ") and not line.startswith("| #")]
    assert [r.split(" | ")[0].strip("| ") for r in rows] == ["1", "6", "2", "0"]  # trial 4 missed the SLO
    assert "| 1 | recommended | max-num-seqs=16 gpu-memory-utilization=0.3 max-model-len=2048" in rows[0]
    assert "| 120.00 | 21.5 | 420.0 |" in rows[0]  # p95 TTFT once: it is the objective's column


def _top_header(md: str) -> list[str]:
    top = md[md.index("## Top configurations"):md.index("## Pictures")]
    return next(line for line in top.splitlines() if line.startswith("| #")).strip("| ").split(" | ")


def test_the_top_table_shows_the_objective_once(tmp_path, study_dir):
    latency = _markdown(latency_study(tmp_path), study_dir, tmp_path / "out")
    assert _top_header(latency) == ["#", "role", "parameters", "ttft_p95 (ms)", "tpot_ms_p95", "output_throughput"]
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/thr.db", direction="maximize")
    study.add_trial(_complete(300.0, _args(8, 0.3), _metrics(250.0, 300.0), baseline=True))
    study.add_trial(_complete(420.0, _args(16, 0.3), _metrics(120.0, 420.0)))
    throughput = write_report(study, MODEL, tmp_path / "art", ThroughputObjective(), tmp_path / "thr")
    header = _top_header(throughput.markdown.read_text())
    assert header == ["#", "role", "parameters", "output_throughput (tok/s)", "ttft_ms_p95", "tpot_ms_p95"]
    pareto = optuna.create_study(storage=f"sqlite:///{tmp_path}/par.db", directions=["maximize", "minimize"])
    pareto.add_trial(_complete([420.0, 120.0], _args(16, 0.3), _metrics(120.0, 420.0), baseline=True))
    front = write_report(pareto, MODEL, tmp_path / "art", ParetoObjective(), tmp_path / "par")
    assert _top_header(front.markdown.read_text())[3:] == ["output_throughput,ttft_p95 (tok/s, ms)", "tpot_ms_p95"]


def test_failure_table_lists_pruned_failed_and_infeasible_trials(tmp_path, study_dir):
    md = _markdown(latency_study(tmp_path), study_dir, tmp_path / "out")
    failures = md[md.index("## Failures"):md.index("## Savings")]
    rows = {r.split(" | ")[0].strip("| "): r for r in failures.splitlines() if r.startswith("| ") and "---" not in r}
    assert "kv_too_small" in rows["3"] and "PRUNED" in rows["3"]
    assert "infra" in rows["5"] and "FAIL" in rows["5"]
    assert "| slo_missed | tpot_p95 40% over its limit |" in rows["4"]
    evidence = rows["3"].split(" | ")[3]
    assert len(evidence) == 160 and evidence.endswith("…") and LONG_EVIDENCE.startswith(evidence[:-1])


def test_failure_table_carries_the_diagnosis_cause_and_remedy(tmp_path, study_dir, monkeypatch):
    weak = StubDiagnosis(2, "weak", "no better than the baseline", "drop it", "180 ms vs 250 ms")
    monkeypatch.setitem(sys.modules, "optimizer.report.diagnosis", _stub_module([weak]))
    md = _markdown(latency_study(tmp_path), study_dir, tmp_path / "out")
    assert "| 3 | PRUNED | kv_too_small |" in md and "| stub cause of 3 | stub remedy of 3 |" in md
    assert "| 2 | COMPLETE | weak | 180 ms vs 250 ms | no better than the baseline | drop it |" in md


_RUNS = {"1": {"values": [120.0, 118.0, 126.0], "failed": 0},
         "6": {"values": [150.0, 149.0, 156.0], "failed": 0},
         "0": {"values": [250.0, 244.0, 262.0], "failed": 0}}
CONFIRMED = {"runs": _RUNS, "repeats": 2, "top": 2, "candidates": ["1", "6"], "baseline": 0,
             **decide(_RUNS, ["1", "6"], pooled(e["values"] for e in _RUNS.values()), maximize=False)}
MINIMAL_ARGS = ["--max-num-seqs", "16", "--gpu-memory-utilization", "0.3", "--load-format", "dummy"]


def _minimal(study, winner=1):
    study.set_user_attr("minimal", {
        "winner": winner, "done": True, "candidates": ["1", "6"], "repeats": 2, "boots": 3, "wall_s": 150.0, "runs": {},
        "rows": [{"knob": "max-num-seqs", "baseline": None, "winner": 16, "reverted_to": None, "values": [400.0, 390.0],
                  "failed": False, "effect": {"ratio": 3.3, "low": 2.9, "high": 3.8}, "verdict": "kept", "note": ""},
                 {"knob": "max-model-len", "baseline": None, "winner": 2048, "reverted_to": None, "values": [119.0],
                  "failed": False, "effect": {"ratio": 0.98, "low": 0.85, "high": 1.13}, "verdict": "reverted",
                  "note": ""}],
        "combined": None, "final": {"knobs": {"max-num-seqs": 16}, "args": MINIMAL_ARGS, "values": [119.0]}})
    return study


def test_the_confirmed_winner_is_recommended_with_the_gain_over_the_re_measured_baseline(tmp_path, study_dir):
    md = _markdown(latency_study(tmp_path, CONFIRMED), study_dir, tmp_path / "out")
    ci = CONFIRMED["intervals"]["1"]
    assert ci["mean"] == pytest.approx((120.0 * 118.0 * 126.0) ** (1 / 3)) and 0 < ci["low"] < ci["mean"] < ci["high"]
    assert f"Recommended (confirmed winner): trial 1, ttft_p95 = {ci['mean']:.2f} ms (mean of 3 runs)" in md
    assert (f"Trial 1 re-measured: {ci['mean']:.2f} ms over 3 run(s), 95% range [{ci['low']:.2f}, {ci['high']:.2f}]; "
            "a clear winner: every other candidate measured worse beyond the noise") in md
    gain = md[md.index("Gain over the baseline: "):].splitlines()[0]
    ratio, low, high = map(float, re.match(r"Gain over the baseline: ([\d.]+)x \(95% CI ([\d.]+)-([\d.]+)x\)",
                                           gain).groups())
    assert low < 250.0 / 121.0 < high and low < ratio < high and low > 1.5  # both sides measured 3 times
    assert "from 3 run(s) of the recommendation and 3 of the baseline" in md
    assert "## What mattered" not in md  # no minimal-change step ran


def test_the_minimal_change_is_what_every_written_surface_names(tmp_path, study_dir):
    study = _minimal(latency_study(tmp_path, CONFIRMED))
    files = write_report(study, MODEL, study_dir, _objective(), tmp_path / "out")
    md = files.markdown.read_text()
    assert "Recommended (minimal change): trial 1 with the knobs that had no measurable effect put back" in md
    assert yaml.safe_load(files.best_yaml.read_text()) == serve_yaml(MINIMAL_ARGS)
    assert serve_command(MODEL, MINIMAL_ARGS) in md and serve_command(MODEL, BEST_ARGS) not in md
    mattered = md[md.index("## What mattered"):md.index("## Deploy")]
    assert "| max-num-seqs | (vLLM default) | 16 | 3.30x [2.90, 3.80] over 2 runs | kept |" in mattered
    assert "| max-model-len | (vLLM default) | 2048 | 0.98x [0.85, 1.13] over 1 run | reverted |" in mattered
    assert "badge names trial 1" in md  # Optuna's single best is trial 1 too, but its flags are not recommended
    top = md[md.index("## Top configurations"):md.index("## Pictures")]
    assert top.index("| - | recommended (trial 1, knobs put back) | max-num-seqs=16 gpu-memory-utilization=0.3 |") \
        < top.index("| 1 | winner |") < top.index("| 6 |")


def test_a_stale_minimal_record_is_not_recommended(tmp_path, study_dir):
    study = _minimal(latency_study(tmp_path, CONFIRMED), winner=6)  # written for another winner
    md = _markdown(study, study_dir, tmp_path / "out")
    assert "Recommended (confirmed winner): trial 1" in md and "## What mattered" not in md


def test_missing_request_records_are_said_not_fatal(tmp_path, study_dir):
    (study_dir / "trial-1" / "requests.jsonl").unlink()
    files = write_report(latency_study(tmp_path), MODEL, study_dir, _objective(), tmp_path / "out")
    md = files.markdown.read_text()
    assert "request records not found for recommended (" in md and "trial-1/requests.jsonl: missing)" in md
    assert "ttft" in files.pictures  # the baseline's alone
    (study_dir / "trial-0" / "requests.jsonl").unlink()
    (tmp_path / "again").mkdir()
    files = write_report(latency_study(tmp_path / "again"), MODEL, study_dir, _objective(), tmp_path / "out2")
    assert "ttft" not in files.pictures and "request records not found for baseline" in files.markdown.read_text()


def test_read_ttft_ms_uses_successful_requests(study_dir):
    values = read_ttft_ms(study_dir / "trial-1" / "requests.jsonl")
    assert values == pytest.approx([80.0 + 2 * i for i in range(20)])
    assert read_ttft_ms(study_dir / "trial-9" / "requests.jsonl") is None


def test_too_few_trials_for_importance(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/t.db", direction="minimize")
    study.add_trial(_complete(250.0, _args(8, 0.3), _metrics(250.0, 300.0), baseline=True))
    study.add_trial(_complete(120.0, _args(16, 0.4), _metrics(120.0, 420.0)))
    files = write_report(study, MODEL, tmp_path / "art", LatencyObjective(), tmp_path / "out")
    assert "importance" not in files.pictures and not (tmp_path / "out" / "importance.png").exists()
    assert TOO_FEW in files.markdown.read_text()


def test_importance_is_drawn_from_twelve_completed_trials_and_says_what_it_rests_on(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/t.db", direction="minimize")
    for i, seqs in enumerate((8, 16, 24, 32, 40, 48, 56, 64, 4, 12, 20, 28)):
        mem = 0.2 + 0.025 * ((i * 7) % 12)
        study.add_trial(_complete(2000.0 / seqs, _args(seqs, mem), _metrics(2000.0 / seqs, 300.0), baseline=i == 0))
    files = write_report(study, MODEL, tmp_path / "art", LatencyObjective(), tmp_path / "out")
    assert files.pictures["importance"][0].read_bytes().startswith(PNG)
    assert "PED-ANOVA fitted on 12 completed trials" in files.markdown.read_text()


@pytest.mark.parametrize("values, log", [([40.0, 300.0, 2400.0], True), ([80.0, 120.0, 400.0], False), ([], False)])
def test_the_ttft_axis_is_logarithmic_when_the_runs_span_more_than_20x(values, log):
    assert log_axis(values) is log


def test_pareto_study_lists_its_front_and_writes_pareto_front_yaml(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/t.db", directions=["maximize", "minimize"])
    for seqs, thr, ttft in ((8, 300.0, 250.0), (16, 420.0, 120.0), (32, 500.0, 180.0), (4, 200.0, 300.0)):
        study.add_trial(_complete([thr, ttft], _args(seqs, 0.3), _metrics(ttft, thr), baseline=seqs == 8))
    files = write_report(study, MODEL, tmp_path / "art", ParetoObjective(), tmp_path / "out")
    md = files.markdown.read_text()
    assert "Pareto front (output_throughput / ttft_p95): 2 trial(s)" in md
    assert serve_command(MODEL, _args(16, 0.3)) in md and serve_command(MODEL, _args(32, 0.3)) in md
    front = yaml.safe_load(files.front_yaml.read_text())
    assert sorted(m["trial"] for m in front) == [1, 2] and files.best_yaml is None
    assert non_dominated([(250.0, 300.0), (120.0, 420.0), (180.0, 500.0), (300.0, 200.0)]) == {1, 2}
    assert files.pictures["tradeoff"][0].read_bytes().startswith(PNG)


def test_sensitivity_table_when_the_study_has_one(tmp_path, study_dir):
    study = latency_study(tmp_path)
    from optimizer.verdict import sensitivity

    noise = sensitivity.band([118.0, 120.0, 122.0])  # the best's p95 TTFT, ms
    row = sensitivity.effect("max-num-seqs", 16, 32, 141.5, noise, maximize=False)
    study.set_user_attr("sensitivity", [{**row, "trial": 1}])
    md = _markdown(study, study_dir, tmp_path / "out")
    assert "## Sensitivity" in md and "Trial 1 re-measured with one knob moved at a time" in md
    assert "| max-num-seqs | 16 | 32 | 141.5 | 0.85 | 110.5 to 130.3 | 3 | worse |" in md
    assert "Saved: 0 boot(s) avoided by the KV precheck; 0 trial(s) stopped early; ~0 s of replay not spent." in md


def test_user_text_is_escaped_in_html(tmp_path, study_dir):
    files = write_report(latency_study(tmp_path), "<b>model</b>", study_dir, _objective(), tmp_path / "out")
    page = files.html.read_text()
    assert "<b>model</b>" not in page and "&lt;b&gt;model&lt;/b&gt;" in page


def parse_with_vllm(model: str, best_yaml):
    """`vllm serve MODEL --config best.yaml` parsed the way vLLM's CLI main does (the end-to-end
    test uses it on a real study's best.yaml too)."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vLLM CLI")
    serve = ServeSubcommand()
    serve.subparser_init(parser.add_subparsers(required=False, dest="subparser"))
    ns = parser.parse_args(["serve", model, "--config", str(best_yaml)])
    serve.validate(ns)
    return ns


def test_vllm_parses_best_yaml_as_vllm_serve_does(tmp_path, study_dir, tiny_model):
    """`vllm serve MODEL --config best.yaml` as vLLM's CLI main builds it: a FlexibleArgumentParser
    whose `serve` subparser is ServeSubcommand's; the top-level parser expands --config."""
    files = write_report(latency_study(tmp_path), MODEL, study_dir, _objective(), tmp_path / "out")
    ns = parse_with_vllm(str(tiny_model), files.best_yaml)
    assert ns.subparser == "serve" and ns.model_tag == str(tiny_model)
    assert (ns.max_num_seqs, ns.gpu_memory_utilization, ns.max_model_len) == (16, 0.3, 2048)
    assert (ns.kv_cache_dtype, ns.load_format, ns.enable_prefix_caching) == ("fp8", "dummy", False)


def test_a_study_where_nothing_completed_still_gets_a_report(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/t.db", direction="maximize")
    study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.PRUNED, user_attrs={"baseline": True, "vllm_args": [], "failure_kind": "timeout",
                                                          "evidence": "no /health in 600 s", "remedy": "wait longer"}))
    files = write_report(study, MODEL, tmp_path / "art", ThroughputObjective(), tmp_path / "out")
    md = files.markdown.read_text()
    assert files.best_yaml is None and files.pictures == {} and not (tmp_path / "out" / "best.yaml").exists()
    assert "No trial completed" in md and "Nothing to deploy." in md and "| 0 | PRUNED | timeout |" in md
    assert TOO_FEW in md


def test_when_the_baseline_is_the_best_the_report_says_keep_it(tmp_path, study_dir):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/b.db", study_name="lat", direction="minimize")
    study.add_trial(_complete(250.0, BEST_ARGS, _metrics(250.0, 300.0), baseline=True, constraints={"tpot_p95": -0.5}))
    study.add_trial(_complete(400.0, _args(32, 0.4), _metrics(400.0, 200.0), constraints={"tpot_p95": -0.1}))
    md = _markdown(study, study_dir, tmp_path / "out")
    assert "The baseline is the best configuration found: no other beat it (gain 1.00x); keep it." in md
    assert "95% CI" not in md


def test_the_start_up_picture_stacks_each_booted_trials_steps(tmp_path, study_dir):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/t.db", study_name="lat", direction="minimize")
    for number, (value, args, steps, cache) in enumerate((
            (250.0, ["--load-format", "dummy"], {"import": 11.7, "config": 12.0, "engine_start": 14.0, "weights": 1.0,
                                                 "compile": 58.0, "kv_cache": 2.0, "api_ready": 1.0}, "miss"),
            (120.0, BEST_ARGS, {"import": 10.6, "config": 11.0, "engine_start": 11.0, "weights": 1.0,
                                "compile": 25.0, "kv_cache": 1.0, "api_ready": 1.0}, "reload_failed"))):
        t = _complete(value, args, _metrics(value, 300.0), baseline=number == 0, params={} if number == 0 else None,
                      constraints={"tpot_p95": -0.5})
        t.set_user_attr("startup", {"steps": steps, "compile_cache": cache, "ready": True})
        study.add_trial(t)
    files = write_report(study, MODEL, study_dir, _objective(), tmp_path / "out")
    png, page = files.pictures["startup"]
    assert png.read_bytes().startswith(PNG)
    html = page.read_text()
    assert "compile" in html and "#1 (cache reload failed)" in html and "kv cache" in html
    assert '<img src="startup.png"' in files.html.read_text()


def test_no_start_up_read_is_a_note_not_a_picture(tmp_path, study_dir):
    files = write_report(latency_study(tmp_path), MODEL, study_dir, _objective(), tmp_path / "out")
    assert "startup" not in files.pictures and "no trial's server log was read" in files.markdown.read_text()


def test_the_same_confirmation_gives_the_same_verdict_on_every_surface(tmp_path, study_dir):
    """The console's progress lines, its final report and the written report read one stored verdict."""
    import io

    from rich.console import Console

    from optimizer.driver.progress import Progress
    from optimizer.record.remeasured import Confirmation
    from optimizer.report.console import print_report
    from optimizer.text.verdicts import verdict_phrase

    close = {"1": {"values": [120.0, 118.0, 126.0], "failed": 0}, "6": {"values": [123.0, 121.0, 119.0], "failed": 0},
             "0": {"values": [250.0, 244.0, 262.0], "failed": 0}}
    for i, (runs, phrase) in enumerate(((_RUNS, "a clear winner"), (close, "no clear winner: trial 1"))):
        record = {"runs": runs, "repeats": 2, "top": 2, "candidates": ["1", "6"], "baseline": 0,
                  **decide(runs, ["1", "6"], pooled(e["values"] for e in runs.values()), maximize=False)}
        (tmp_path / str(i)).mkdir()
        study = latency_study(tmp_path / str(i), record)
        md = _markdown(study, study_dir, tmp_path / "out")
        live, final = io.StringIO(), io.StringIO()
        Progress(Console(file=live, width=300)).confirmed(Confirmation.of(record), _objective())
        print_report(study, MODEL, study_dir, _objective(), Console(file=final, width=300))
        said = verdict_phrase(Confirmation.of(record))
        assert said.startswith(phrase)
        assert said in md and said in live.getvalue() and said in final.getvalue()
        assert all(ci["low"] > 0 for ci in record["intervals"].values())  # never a negative bound
