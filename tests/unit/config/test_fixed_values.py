"""Baseline and warm-start values are checked at the door (type, allowed value, range vLLM
accepts), so a bad one is a one-line error, never a traceback after the study was opened."""

import pytest

from optimizer.config.schema import StudyConfig
from optimizer.config.space import resolve
from optimizer.errors import ConfigError

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


RULES = {"max-num-seqs": {"low": 4, "high": 128}, "enable-chunked-prefill": {}, "max-num-batched-tokens": {}}


@pytest.mark.parametrize("baseline, message", [
    ({"max-num-seqs": 128, "max-num-batched-tokens": 64},
     "baseline: max-num-batched-tokens (64) is below max-num-seqs (128); vLLM refuses to start; "
     "raise it to at least 128"),
    ({"enable-chunked-prefill": False, "max-num-batched-tokens": 4096, "max-model-len": 8192},
     "baseline: max-num-batched-tokens (4096) is below max-model-len (8192) with enable-chunked-prefill false; "
     "vLLM refuses to start; raise it to at least 8192 or enable chunked prefill"),
    ({"enable-chunked-prefill": False, "max-num-batched-tokens": 8192},  # vLLM's max-model-len: the model's limit
     "baseline: max-num-batched-tokens (8192) is below max-model-len (65536, the model's limit) with "
     "enable-chunked-prefill false; vLLM refuses to start; raise it to at least 65536 or enable chunked prefill"),
    ({"max-num-batched-tokens": 0}, "baseline.max-num-batched-tokens: 0 must be at least 1"),
    ({"enable-prefix-caching": "yes"}, "baseline.enable-prefix-caching: 'yes' is not one of True, False"),
    ({"block-size": 16}, "baseline.block-size: 16 is not one of 32, 64, 128"),
])
def test_baselines_vllm_refuses_are_one_line_errors(baseline, message):
    with pytest.raises(ConfigError) as exc:
        _resolve(baseline=baseline, space=RULES)
    assert str(exc.value) == message


@pytest.mark.parametrize("baseline", [
    {"max-num-seqs": 128, "max-num-batched-tokens": 128},
    {"max-num-batched-tokens": 64},  # vLLM lowers its default max-num-seqs to fit
    {"enable-chunked-prefill": True, "max-num-batched-tokens": 512, "max-model-len": 8192},
    {"enable-chunked-prefill": False, "max-num-batched-tokens": 8192, "max-model-len": 8192},
    {"enable-chunked-prefill": False, "enable-prefix-caching": False, "block-size": 64},
])
def test_baselines_vllm_accepts_pass(baseline):
    _resolve(baseline=baseline, space=RULES)


@pytest.mark.parametrize("entry, match", [
    ({"max-num-batched-tokens": 512}, r"^enqueue\.0\.max-num-batched-tokens: sampled only when "
                                       r"enable-chunked-prefill is true; add `enable-chunked-prefill: true`"),
    ({"enable-chunked-prefill": False, "max-num-batched-tokens": 512}, "sampled only when enable-chunked-prefill"),
    ({"enable-chunked-prefill": True, "max-num-batched-tokens": 64},  # the trial may draw up to 128 sequences
     r"^enqueue\.0: max-num-batched-tokens \(64\) is below max-num-seqs \(128, the space's high\)"),
    ({"max-num-seqs": 512}, r"^enqueue\.0: max-num-batched-tokens \(256, the space's low\) is below max-num-seqs "
                            r"\(512\); vLLM refuses to start; add `max-num-batched-tokens: 512` or more"),
])
def test_warm_starts_that_can_draw_a_refused_trial_are_refused(entry, match):
    with pytest.raises(ConfigError, match=match):
        _resolve(enqueue=[entry], space=RULES)


def test_warm_starts_that_always_start_pass():
    _resolve(space=RULES, enqueue=[{"enable-chunked-prefill": True, "max-num-batched-tokens": 128},
                                   {"enable-chunked-prefill": False, "max-num-seqs": 64}, {"max-num-seqs": 128}])
