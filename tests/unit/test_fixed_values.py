"""Baseline and warm-start values are checked at the door (type, allowed value, range vLLM
accepts), so a bad one is a one-line error, never a traceback after the study was opened."""

import pytest

from optimizer.config import StudyConfig
from optimizer.errors import ConfigError
from optimizer.space import resolve

from .test_space import LONGEST, MODEL, cpu


def _resolve(baseline=None, enqueue=(), space=None):
    cfg = StudyConfig(model={"path": "tiny"}, baseline=baseline, enqueue=list(enqueue), space=space or {})
    return resolve(cfg, cpu(), MODEL, LONGEST)


@pytest.mark.parametrize("baseline, words", [
    ({"kv-cache-dtype": "fp8_e4m3"}, "baseline.kv-cache-dtype"),
    ({"max-num-seqs": 16.5}, "whole number"),
    ({"max-num-seqs": True}, "whole number"),
    ({"gpu-memory-utilization": 1.5}, "fraction"),
    ({"max-model-len": 1024}, "longest request"),
])
def test_bad_baseline_values_are_refused(baseline, words):
    with pytest.raises(ConfigError, match=words):
        _resolve(baseline=baseline)


def test_baseline_choice_must_be_one_the_space_allows():
    with pytest.raises(ConfigError, match="'auto' is not one of fp8"):
        _resolve(baseline={"kv-cache-dtype": "auto"}, space={"kv-cache-dtype": {"choices": ["fp8"]}})


def test_a_warm_start_knob_outside_the_space_is_refused_not_dropped():
    with pytest.raises(ConfigError, match="enqueue.0.max-model-len: not in the search space"):
        _resolve(enqueue=[{"max-model-len": 8192}], space={"max-num-seqs": {"low": 4, "high": 8}})


def test_good_values_pass():
    _resolve(baseline={"max-num-seqs": 16, "gpu-memory-utilization": 0.5, "max-model-len": 8192,
                       "kv-cache-dtype": "auto"}, enqueue=[{"max-num-seqs": 32}])
