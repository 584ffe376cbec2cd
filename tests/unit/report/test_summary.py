"""report/summary.py: the best trial as a `vllm serve` command and a `vllm serve --config` YAML; gain."""

import optuna
import pytest
import yaml

from optimizer.deploy.serve import serve_command, serve_yaml
from optimizer.report.summary import summarize_study
from optimizer.verdict.trials import gain

ARGS = ["--max-num-seqs", "24", "--gpu-memory-utilization", "0.37", "--max-model-len", "8192",
        "--kv-cache-dtype", "fp8", "--load-format", "dummy", "--enforce-eager", "--dtype", "bfloat16"]
MAX, MIN = optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE


def test_serve_command():
    assert serve_command("/models/tiny", ARGS[:4]) == \
        "vllm serve /models/tiny --max-num-seqs 24 --gpu-memory-utilization 0.37"


def test_serve_yaml_uses_long_flag_names_and_typed_knob_values():
    out = serve_yaml(ARGS)
    assert out == {"max-num-seqs": 24, "gpu-memory-utilization": 0.37, "max-model-len": 8192,
                   "kv-cache-dtype": "fp8", "load-format": "dummy", "enforce-eager": True, "dtype": "bfloat16"}
    assert type(out["max-num-seqs"]) is int and type(out["gpu-memory-utilization"]) is float
    text = yaml.safe_dump(out, sort_keys=False)
    assert "max-num-seqs: 24\n" in text and "enforce-eager: true\n" in text


def test_serve_yaml_reads_flags_written_with_an_equals_sign():
    # engine.extra_args may hold `--max-num-batched-tokens=512`, a form vLLM accepts.
    out = serve_yaml(["--max-num-batched-tokens=512", "--max-num-seqs=8"])
    assert not any("=" in key for key in out)
    assert out["max-num-batched-tokens"] in ("512", 512) and out["max-num-seqs"] == 8


@pytest.mark.parametrize("direction, best, base, expected", [
    (MAX, 150.0, 100.0, 1.5), (MAX, 80.0, 100.0, 0.8), (MIN, 50.0, 100.0, 2.0), (MIN, 125.0, 100.0, 0.8),
])
def test_gain_is_above_one_when_better_whatever_the_direction(direction, best, base, expected):
    assert gain(direction, best, base) == pytest.approx(expected)


def _told(runs) -> optuna.Study:
    """A maximizing study of (value, vllm_args, is the baseline) trials, told in order."""
    study = optuna.create_study(direction="maximize")
    for value, args, baseline in runs:
        trial = study.ask()
        trial.set_user_attr("vllm_args", args)
        if baseline:
            trial.set_user_attr("baseline", True)
        study.tell(trial, value)
    return study


def test_summary_of_a_study_writes_the_best_yaml(tmp_path):
    study = _told(((100.0, ARGS[:2], True), (150.0, ARGS[:4], False), (120.0, ARGS[:2], False)))
    s = summarize_study(study, "/models/tiny", tmp_path / "art")
    assert (s.best.number, s.baseline.number) == (1, 0)
    assert s.gain == pytest.approx(1.5)
    assert s.command == "vllm serve /models/tiny " + " ".join(ARGS[:4])
    assert yaml.safe_load(s.yaml_path.read_text()) == {"max-num-seqs": 24, "gpu-memory-utilization": 0.37}


def test_summary_without_a_completed_trial_has_no_best(tmp_path):
    study = optuna.create_study()
    trial = study.ask()
    trial.set_user_attr("baseline", True)
    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    s = summarize_study(study, "/m", tmp_path / "art")
    assert s.best is None and s.gain is None and s.baseline.number == 0
    assert not (tmp_path / "art").exists()


def test_a_best_yaml_of_random_weights_says_so_first_and_is_replaced_whole(tmp_path, monkeypatch):
    study = _told(((100.0, ARGS[:2] + ARGS[8:10], True), (150.0, ARGS[:4] + ARGS[8:10], False)))
    s = summarize_study(study, "/models/tiny", tmp_path / "art")
    text = s.yaml_path.read_text()
    assert text.startswith("# Measured with random weights (--load-format dummy): for speed only.")
    assert yaml.safe_load(text)["load-format"] == "dummy"
    # a disk that refuses the write mid-way leaves the old best.yaml whole, and no temporary file
    import os

    def full(fd, *a):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    assert summarize_study(study, "/models/tiny", tmp_path / "art").yaml_path is None
    assert s.yaml_path.read_text() == text
    assert sorted(p.name for p in s.yaml_path.parent.iterdir()) == ["best.yaml", "k8s.yaml"]


def test_what_a_trial_claimed_is_its_kv_budget_and_the_rest_per_rank():
    from optimizer.deploy.k8s import claimed_bytes

    study = optuna.create_study()
    t = study.ask()
    t.set_user_attr("kv_estimate", {"budget_bytes": 3 << 30, "non_kv_bytes": 1 << 30})
    study.tell(t, 1.0)
    assert claimed_bytes(study.trials[0], 2) == 8 << 30
    bare = study.ask()
    study.tell(bare, 1.0)
    assert claimed_bytes(study.trials[1], 1) is None
