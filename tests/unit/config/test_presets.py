"""config/presets.py + cli --goal: each goal sets the objective, its SLOs and the workload; explicit flags win."""

import pytest

from objectives import get_objective
from optimizer.cli.common import load as _load
from optimizer.cli.entry import parser as _parser
from optimizer.config.presets import PRESETS, preset
from optimizer.measure.slo import parse_slos


def load(tmp_path, *flags):
    (tmp_path / "study.yaml").write_text("model: {path: /m}\nobjective: {name: throughput}\n"
                                         "workload: {scenario: chat, requests: 5}\n")
    ns = _parser().parse_args(["run", "--config", str(tmp_path / "study.yaml"), *flags])
    return _load(ns)


@pytest.mark.parametrize("goal, objective, scenario, slos", [
    ("chat", "latency", "chat", "tpot:50"),
    ("batch", "throughput", "batch", None),
    ("agent", "goodput", "agent", "ttft:1000 tpot:50"),
])
def test_goal_sets_objective_slos_and_workload(tmp_path, goal, objective, scenario, slos):
    cfg = load(tmp_path, "--goal", goal)
    assert cfg.objective.name == objective and cfg.objective.slos == slos
    assert cfg.workload.scenario == scenario
    # the objective the preset names is constructible as the study builds it (goodput needs its SLOs)
    obj = get_objective(cfg.objective.name, cfg.objective.metric, parse_slos(cfg.objective.slos))
    assert obj.slos == parse_slos(slos)


def test_explicit_flags_beat_the_preset(tmp_path):
    cfg = load(tmp_path, "--goal", "chat", "--slo", "tpot:80 ttft_p99:2000")
    assert cfg.objective.name == "latency" and cfg.objective.slos == "tpot:80 ttft_p99:2000"
    cfg = load(tmp_path, "--goal", "agent", "--objective", "throughput")
    assert cfg.objective.name == "throughput" and cfg.objective.slos is None  # the preset's SLOs went with it
    assert cfg.workload.scenario == "agent"  # the workload stays the goal's
    (tmp_path / "w.yaml").write_text("workload: {scenario: burst, requests: 9}\n")
    assert load(tmp_path, "--goal", "agent", "--workload", str(tmp_path / "w.yaml")).workload.scenario == "burst"


def test_agent_preset_is_open_loop_so_goodput_can_scale_it():
    assert PRESETS["agent"]["workload"]["arrival"]["process"] != "closed"


def test_unknown_goal_is_refused_by_the_parser_and_by_preset(capsys):
    with pytest.raises(SystemExit) as exit_:
        _parser().parse_args(["run", "--goal", "fastest"])
    assert exit_.value.code == 2 and "fastest" in capsys.readouterr().err
    with pytest.raises(KeyError, match="chat, batch, agent"):
        preset("fastest")


def test_no_precheck_flag(tmp_path):
    assert load(tmp_path).precheck is True
    assert load(tmp_path, "--no-precheck").precheck is False
