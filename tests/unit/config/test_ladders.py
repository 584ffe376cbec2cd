"""Ladders (config/round_values.py, config/space.py): the knobs in vLLM's compile key run at the
operator-style value nearest the draw, in order, within the range; off on request; refused on
knobs without one."""

import math

import optuna
import pytest

from optimizer.config.model_info import ModelInfo
from optimizer.config.round_values import LADDERS, rungs, snap_to_ladder
from optimizer.config.schema import StudyConfig
from optimizer.config.space import resolve
from optimizer.search.suggest import suggest
from optimizer.engine.device import GIB, Device, NodeMemory
from optimizer.errors import ConfigError

MODEL = ModelInfo("tiny", layers=8, kv_heads=8, head_dim=64, hidden=512, intermediate=1024,
                  vocab_size=4096, max_positions=65536, dtype="bfloat16")
CPU = Device("cpu", 0, NodeMemory(16 * GIB, 12 * GIB))


def space_of(space: dict):
    return resolve(StudyConfig(model={"path": "tiny"}, space=space), CPU, MODEL, 3200)


@pytest.mark.parametrize("value, out", [(4, 4), (5.4, 4), (5.8, 8), (13, 12), (14, 16), (20, 24), (100, 96),
                                        (111, 128), (128, 128), (3, 4), (500, 128)])
def test_a_draw_runs_at_the_nearest_rung_in_log_space_within_the_range(value, out):
    assert snap_to_ladder("max-num-seqs", value, 4, 128) == out


def test_the_mapping_keeps_the_order_and_a_range_without_rungs_stays_free():
    draws = [4 * math.exp(i / 50 * math.log(32)) for i in range(51)]  # 4..128 on a log scale
    snapped = [snap_to_ladder("max-num-seqs", v, 4, 128) for v in draws]
    assert snapped == sorted(snapped) and set(snapped) == set(rungs("max-num-seqs", 4, 128))
    assert rungs("max-num-seqs", 4, 128) == (4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
    assert snap_to_ladder("max-num-seqs", 13.6, 13, 15) == 13  # no rung in [13, 15]: the draw, whole
    assert rungs("max-num-batched-tokens", 256, 8192) == tuple(v for v in LADDERS["max-num-batched-tokens"] if v <= 8192)


def test_sampled_trials_run_rungs_and_enqueued_values_run_as_written():
    space = space_of({"max-num-seqs": {"low": 4, "high": 128}, "enable-chunked-prefill": {"choices": [True]},
                      "max-num-batched-tokens": {"low": 256, "high": 8192}})
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    seen = set()
    for _ in range(60):
        trial = study.ask()
        params = suggest(trial, space)
        assert params["max-num-seqs"] in LADDERS["max-num-seqs"] and params["max-num-batched-tokens"] in LADDERS[
            "max-num-batched-tokens"]
        assert params["max-num-batched-tokens"] >= params["max-num-seqs"]  # vLLM's rule still holds
        assert trial.params["max-num-seqs"] != params["max-num-seqs"] or params["max-num-seqs"] in LADDERS["max-num-seqs"]
        seen.add(params["max-num-seqs"])
    assert len(seen) <= 10  # the rungs in [4, 128]
    study.enqueue_trial({"max-num-seqs": 13, "enable-chunked-prefill": True, "max-num-batched-tokens": 1000})
    assert suggest(study.ask(), space)["max-num-seqs"] == 13  # a baseline off the ladder runs as written


def test_ladder_false_searches_every_whole_number():
    space = space_of({"max-num-seqs": {"low": 4, "high": 128, "ladder": False}})
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    values = {suggest(study.ask(), space)["max-num-seqs"] for _ in range(40)}
    assert values - set(LADDERS["max-num-seqs"])  # values between the rungs are run


def test_ladder_on_a_knob_outside_the_compile_key_is_refused():
    with pytest.raises(ConfigError, match=r"space.max-model-len: `ladder` applies to max-num-seqs and "
                                          r"max-num-batched-tokens only"):
        space_of({"max-model-len": {"ladder": True}})
    with pytest.raises(ConfigError, match="not low/high/log/ladder"):
        space_of({"kv-cache-dtype": {"ladder": True}})
