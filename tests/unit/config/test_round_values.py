"""config/round_values.py and its use in sampling: values an operator writes, within the range."""

import optuna
import pytest

from optimizer.config.round_values import (
    fitting_model_len,
    round_fraction,
    round_model_len,
)
from optimizer.config.space import KNOBS, Dimension, SearchSpace
from optimizer.search.suggest import suggest


@pytest.mark.parametrize("value, low, high, out", [(0.2311, 0.07, 0.8, 0.23), (0.0712, 0.0712, 0.8, 0.08),
                                                  (0.7991, 0.07, 0.795, 0.79), (0.5, 0.5, 0.5, 0.5)])
def test_a_fraction_is_rounded_to_two_decimals_inside_its_range(value, low, high, out):
    assert round_fraction(value, low, high) == out


def test_max_model_len_goes_up_to_a_block_multiple_and_fits_as_a_power_of_two():
    assert round_model_len(44169, 128, 65536) == 44288
    assert round_model_len(65500, 128, 65530) == 65500  # past the model's limit: left as drawn
    assert fitting_model_len(1792, 128, 65536) == 2048
    assert fitting_model_len(40000, 128, 50000) == 40064  # 65536 is past the model: a block multiple


def test_sampled_trials_run_round_values_and_enqueued_ones_run_as_written():
    space = SearchSpace((Dimension(KNOBS["gpu-memory-utilization"], 0.07, 0.8, log=True),
                         Dimension(KNOBS["max-model-len"], 1792, 65536, log=True)))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(20):
        params = suggest(study.ask(), space)
        assert params["gpu-memory-utilization"] == round(params["gpu-memory-utilization"], 2)
        assert params["max-model-len"] % 128 == 0 and 1792 <= params["max-model-len"] <= 65536
    study.enqueue_trial({"gpu-memory-utilization": 0.1234, "max-model-len": 2000})
    assert suggest(study.ask(), space) == {"gpu-memory-utilization": 0.1234, "max-model-len": 2000}
