"""The study's output-regression gate (outputcheck.gate): the baseline's answers become the
reference, a later trial is compared with them and pruned `output_changed` above the maximum
flip rate; and the `regress` command's inputs (candidates, prompt files)."""

from __future__ import annotations

import optuna
import pytest

from optimizer.config.candidate import parse_candidate
from optimizer.config.schema import build_config
from optimizer.errors import ConfigError
from optimizer.outputs import gate as outputcheck
from optimizer.outputs.compare import DEFAULT_PROMPTS, Output
from optimizer.record.of_study import REGRESSION_REFERENCE
from optimizer.trial.spec import TrialResult


def _cfg(**regression):
    return build_config({"model": {"path": "m"}, "regression": {"enabled": True, **regression}})


def _out(i, tokens):
    return Output(i, tuple(f"token_id:{t}" for t in tokens), tuple(-0.1 for _ in tokens),
                  tuple({f"token_id:{t}": -0.1, "token_id:999": -0.4} for t in tokens)).to_dict()


REFERENCE = (_out(0, [1, 2, 3, 4]), _out(1, [5, 6, 7, 8]))


def _result(number, outputs, error=""):
    return TrialResult(number, None, metrics={"ttft_ms_p95": 1.0}, outputs=tuple(outputs), outputs_error=error)


@pytest.fixture
def study():
    return optuna.create_study(direction="minimize")


def _baseline(study, cfg):
    trial = study.ask()
    trial.set_user_attr("baseline", True)
    result = outputcheck.gate(study, trial, _result(0, REFERENCE), cfg)
    study.tell(trial, 1.0)
    return result


def test_the_baselines_answers_become_the_reference(study):
    cfg = _cfg(max_flip_rate=0.1)
    assert _baseline(study, cfg).failure is None
    ref = study.user_attrs[REGRESSION_REFERENCE]
    assert ref["trial"] == 0 and ref["outputs"] == list(REFERENCE)
    assert (ref["max_tokens"], ref["top_k"]) == (32, 5) and len(ref["prompts_sha256"]) == 16
    assert study.user_attrs["max_flip_rate"] == 0.1
    assert study.trials[0].user_attrs["regression"]["summary"].startswith("the reference")


def test_identical_answers_pass_with_flip_rate_zero(study):
    cfg = _cfg(max_flip_rate=0.0)
    _baseline(study, cfg)
    trial = study.ask()
    result = outputcheck.gate(study, trial, _result(1, REFERENCE), cfg)
    assert result.failure is None
    record = study.trials[1].user_attrs["regression"]
    assert record["compared_tokens"] == 8 and record["flips"] == [] and record["reference_trial"] == 0


def test_a_flip_above_the_maximum_prunes_as_output_changed(study):
    cfg = _cfg(max_flip_rate=0.1)
    _baseline(study, cfg)
    trial = study.ask()
    changed = (_out(0, [1, 999, 3, 4]), _out(1, [5, 6, 7, 8]))  # flips at token 1 of prompt 0: 1 of 6 compared
    result = outputcheck.gate(study, trial, _result(1, changed), cfg)
    assert result.failure.kind == "output_changed"
    assert result.failure.evidence.startswith("vs trial 0: top-1 flip rate 0.167 (1 of 6 tokens")
    assert "kv-cache-dtype" in result.failure.remedy
    assert study.trials[1].user_attrs["regression"]["first_divergence"] == [1, None]


def test_without_a_maximum_the_flip_is_reported_only(study):
    cfg = _cfg()
    _baseline(study, cfg)
    trial = study.ask()
    changed = (_out(0, [1, 999, 3, 4]), _out(1, [5, 6, 7, 8]))
    assert outputcheck.gate(study, trial, _result(1, changed), cfg).failure is None
    assert "flip rate 0.167" in study.trials[1].user_attrs["regression"]["summary"]


def test_before_the_baseline_or_without_outputs_nothing_is_judged(study):
    cfg = _cfg(max_flip_rate=0.0)
    trial = study.ask()
    assert outputcheck.gate(study, trial, _result(0, REFERENCE), cfg).failure is None
    assert "the baseline's outputs are not recorded" in study.trials[0].user_attrs["regression"]["summary"]
    other = study.ask()
    assert outputcheck.gate(study, other, _result(1, (), "prompt 0: HTTP 400"), cfg).failure is None
    assert study.trials[1].user_attrs["regression"]["summary"] == "not checked: prompt 0: HTTP 400"


def test_off_by_default():
    cfg = build_config({"model": {"path": "m"}})
    assert outputcheck.trial_spec_part(cfg) is None
    study = optuna.create_study()
    trial = study.ask()
    result = _result(0, REFERENCE)
    assert outputcheck.gate(study, trial, result, cfg) is result and "regression" not in trial.user_attrs


def test_prompt_sets(tmp_path):
    assert outputcheck.trial_spec_part(_cfg(prompts=3, max_tokens=16, top_k=4)) == (DEFAULT_PROMPTS[:3], 16, 4, 1)
    f = tmp_path / "p.txt"
    f.write_text("first prompt\n\n  second prompt \nthird\n")
    assert outputcheck.prompt_set(_cfg(prompts_file=str(f), prompts=2).regression) == ("first prompt", "second prompt")
    f.write_text("\n \n")
    with pytest.raises(ConfigError, match="no prompt in it"):
        outputcheck.prompt_set(_cfg(prompts_file=str(f)).regression)
    with pytest.raises(ConfigError, match="cannot read it"):
        outputcheck.prompt_set(_cfg(prompts_file=str(tmp_path / "missing.txt")).regression)
    with pytest.raises(ConfigError, match="the built-in set has 12"):
        outputcheck.prompt_set(_cfg(prompts=40).regression)


def test_candidates_are_knob_value_pairs_typed_like_the_space():
    assert parse_candidate("kv-cache-dtype=fp8 max-num-seqs=32") == {"kv-cache-dtype": "fp8",
                                                                                  "max-num-seqs": 32}
    assert parse_candidate("--gpu-memory-utilization=0.4,") == {"gpu-memory-utilization": 0.4}
    with pytest.raises(ConfigError, match="'kv-cache-dtype' is not knob=value"):
        parse_candidate("kv-cache-dtype fp8")


def test_median_gap_is_the_chosen_tokens_lead_over_the_runner_up():
    from optimizer.outputs.compare import median_gap

    outs = [Output(0, ("a", "b", "c"), (-0.1, -0.5, -1.0),
                   ({"a": -0.1, "x": -2.1}, {"b": -0.5, "y": -0.6}, {"c": -1.0, "z": -1.5, "w": -3.0}))]
    assert median_gap(outs) == pytest.approx(0.5)  # leads 2.0, 0.1, 0.5
    assert median_gap([Output(0, ("a",), (-0.1,), ({"a": -0.1},))]) is None


def test_candidate_values_are_checked_against_the_knobs_type():
    assert parse_candidate("enable-prefix-caching=false") == {"enable-prefix-caching": False}
    assert parse_candidate("enable-chunked-prefill=on") == {"enable-chunked-prefill": True}
    with pytest.raises(ConfigError, match="max-num-seqs=lots is not a whole number; write e.g. max-num-seqs=32"):
        parse_candidate("max-num-seqs=lots")
    with pytest.raises(ConfigError, match="gpu-memory-utilization=0.9x is not a number"):
        parse_candidate("gpu-memory-utilization=0.9x")
    with pytest.raises(ConfigError, match="enable-prefix-caching is on or off"):
        parse_candidate("enable-prefix-caching=maybe")


def test_a_reference_of_another_prompt_set_is_not_compared(study):
    _baseline(study, _cfg(max_flip_rate=0.0))
    trial = study.ask()
    changed = (_out(0, [1, 999, 3, 4]), _out(1, [5, 6, 7, 8]))
    result = outputcheck.gate(study, trial, _result(1, changed), _cfg(max_flip_rate=0.0, max_tokens=64))
    assert result.failure is None
    assert "another prompt set, max_tokens, top_k or batch" in study.trials[1].user_attrs["regression"]["summary"]


def test_launches_wait_for_the_reference_only_with_a_maximum_and_while_the_baseline_runs(study):
    baseline = study.ask()
    baseline.set_user_attr("baseline", True)
    other = study.ask()
    assert outputcheck.hold_launches(study, _cfg(max_flip_rate=0.05), [baseline])
    assert not outputcheck.hold_launches(study, _cfg(), [baseline])  # report only: nothing to protect
    assert not outputcheck.hold_launches(study, _cfg(max_flip_rate=0.05), [other])  # the baseline is done
    study.set_user_attr(REGRESSION_REFERENCE, {"trial": 0})
    assert not outputcheck.hold_launches(study, _cfg(max_flip_rate=0.05), [baseline])
