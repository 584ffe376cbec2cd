"""config/space.py: resolving the search space against a device, a model and a workload; params <-> flags."""

import optuna
import pytest

from optimizer.config.flags import from_cli_args, to_cli_args
from optimizer.config.model_info import ModelInfo
from optimizer.config.schema import StudyConfig
from optimizer.config.space import DEFAULT_KNOBS, cpu_memory_range, resolve
from optimizer.search.suggest import suggest
from optimizer.engine.device import GIB, Device, NodeMemory
from optimizer.errors import ConfigError

MODEL = ModelInfo("tiny", layers=8, kv_heads=8, head_dim=64, hidden=512, intermediate=1024,
                  vocab_size=4096, max_positions=65536, dtype="bfloat16")
LONGEST = 3200


def cpu(total_gib: float = 16, available_gib: float = 12) -> Device:
    return Device("cpu", 0, NodeMemory(int(total_gib * GIB), int(available_gib * GIB)))


def config(space=None, baseline=None) -> StudyConfig:
    return StudyConfig(model={"path": "tiny"}, space=space or {}, baseline=baseline)


def dims(space) -> dict:
    return {d.knob.name: d for d in space.dims}


def test_defaults_cover_the_core_knobs_within_device_and_model_limits():
    s = resolve(config(), cpu(), MODEL, LONGEST)
    d = dims(s)
    assert list(d) == list(DEFAULT_KNOBS)  # the other knobs are opt-in
    assert (d["max-num-seqs"].low, d["max-num-seqs"].high, d["max-num-seqs"].log) == (4, 128, True)
    assert (d["max-model-len"].low, d["max-model-len"].high) == (LONGEST, 65536)
    assert d["kv-cache-dtype"].choices == ("auto", "fp8")
    mem = d["gpu-memory-utilization"]
    assert 0 < mem.low < mem.high <= 0.9
    assert s.notes == ()


def test_max_model_len_low_is_raised_to_the_longest_request_with_a_note():
    s = resolve(config({"max-model-len": {"low": 1024, "high": 16384}}), cpu(), MODEL, LONGEST)
    d = dims(s)["max-model-len"]
    assert (d.low, d.high) == (LONGEST, 16384)
    assert len(s.notes) == 1 and "1024" in s.notes[0] and str(LONGEST) in s.notes[0]


def test_max_model_len_high_below_the_longest_request_is_refused():
    with pytest.raises(ConfigError, match=r"space\.max-model-len.*longest request \(3200"):
        resolve(config({"max-model-len": {"low": 512, "high": 2048}}), cpu(), MODEL, LONGEST)


def test_max_model_len_never_above_the_models_position_limit():
    # Module docstring: max-model-len never goes above the model's position limit. vLLM
    # rejects such a trial at start, so either refuse the config or clamp the range.
    try:
        s = resolve(config({"max-model-len": {"low": 4096, "high": 131072}}), cpu(), MODEL, LONGEST)
    except ConfigError as exc:
        assert "max-model-len" in str(exc)
    else:
        assert dims(s)["max-model-len"].high <= MODEL.max_positions


@pytest.mark.parametrize("section, where", [("space", "space"), ("baseline", "baseline"), ("enqueue", "enqueue.1")])
def test_unknown_knob_is_named(section, where):
    cfg = {"space": config(space={"max-batch-size": {"low": 1, "high": 8}}),
           "baseline": config(baseline={"max-batch-size": 8}),
           "enqueue": StudyConfig(model={"path": "tiny"}, enqueue=[{"max-num-seqs": 8}, {"max-batch-size": 8}])}
    with pytest.raises(ConfigError, match=rf"^{where}: unknown parameter 'max-batch-size'"):
        resolve(cfg[section], cpu(), MODEL, LONGEST)


def test_gpu_only_kv_dtype_is_refused_on_cpu_but_allowed_on_gpu():
    cfg = config({"kv-cache-dtype": {"choices": ["auto", "fp8_e5m2"]}})
    with pytest.raises(ConfigError, match=r"space\.kv-cache-dtype: 'fp8_e5m2' is not allowed"):
        resolve(cfg, cpu(), MODEL, LONGEST)
    gpu = Device("gpu", 1, NodeMemory(80 * GIB, 80 * GIB))
    assert dims(resolve(cfg, gpu, MODEL, LONGEST))["kv-cache-dtype"].choices == ("auto", "fp8_e5m2")


def test_a_cpu_without_avx512_or_amx_leaves_fp8_out_of_the_space_and_refuses_it_fixed():
    avx2 = Device("cpu", 0, NodeMemory(16 * GIB, 12 * GIB), fp8_kv=False)
    for space in ({}, {"kv-cache-dtype": {"choices": ["auto", "fp8"]}}):
        s = resolve(config(space), avx2, MODEL, LONGEST)
        assert dims(s)["kv-cache-dtype"].choices == ("auto",)
        assert any(n.startswith("kv-cache-dtype fp8 left out: this CPU has no AVX-512 or AMX") for n in s.notes)
    assert resolve(config({"kv-cache-dtype": {"choices": ["auto"]}}), avx2, MODEL, LONGEST).notes == ()  # nothing left out
    with pytest.raises(ConfigError, match=r"^space\.kv-cache-dtype: this CPU has no AVX-512 or AMX.*add auto"):
        resolve(config({"kv-cache-dtype": {"choices": ["fp8"]}}), avx2, MODEL, LONGEST)
    for cfg, where in ((config(baseline={"kv-cache-dtype": "fp8"}), "baseline"),
                       (StudyConfig(model={"path": "tiny"}, enqueue=[{"kv-cache-dtype": "fp8"}]), "enqueue.0")):
        with pytest.raises(ConfigError, match=rf"^{where}\.kv-cache-dtype: 'fp8' cannot start: .*; use auto$"):
            resolve(cfg, avx2, MODEL, LONGEST)


@pytest.mark.parametrize("spec, match", [
    ({"max-num-seqs": {"low": 4.5, "high": 64}}, "whole numbers"),
    ({"max-num-seqs": {"choices": [8, 16]}}, "low/high, not choices"),
    ({"gpu-memory-utilization": {"low": 0.5, "high": 1.5}}, r"\(0, 1\]"),
    ({"max-num-seqs": {"low": 0, "high": 64, "log": True}}, "low > 0"),
    ({"max-num-seqs": {"high": 2}}, "low \\(4\\) is above high \\(2"),
])
def test_bad_ranges_are_refused(spec, match):
    with pytest.raises(ConfigError, match=match):
        resolve(config(spec), cpu(), MODEL, LONGEST)


def test_cpu_memory_range_scales_with_the_node():
    small, big = cpu_memory_range(cpu(16, 12), MODEL), cpu_memory_range(cpu(64, 48), MODEL)
    assert big[0] < small[0] and big[1] >= small[1]
    for (low, high), total, available in ((small, 16, 12), (big, 64, 48)):
        # the low end leaves room for the process (~0.95 GiB) and some KV cache; the high end fits what is free
        assert low * total * GIB > MODEL.weight_bytes() + 1.0 * GIB
        assert high * total * GIB < available * GIB


def test_cpu_memory_too_small_for_the_model_is_a_config_error():
    with pytest.raises(ConfigError, match="1.5 GiB available of 2.0 GiB"):
        cpu_memory_range(cpu(2, 1.5), MODEL)
    with pytest.raises(ConfigError):
        resolve(config(), cpu(2, 1.5), MODEL, LONGEST)


def test_cli_args_round_trip_in_knob_order():
    params = {"kv-cache-dtype": "fp8", "max-model-len": 8192, "gpu-memory-utilization": 0.37, "max-num-seqs": 24}
    args = to_cli_args(params)
    assert args == ["--max-num-seqs", "24", "--gpu-memory-utilization", "0.37", "--max-model-len", "8192",
                    "--kv-cache-dtype", "fp8"]
    back = from_cli_args(args + ["--load-format", "dummy", "--enforce-eager"])
    assert back == params
    assert type(back["max-num-seqs"]) is int and type(back["gpu-memory-utilization"]) is float


def test_suggest_stays_inside_the_ranges():
    s = resolve(config(), cpu(), MODEL, LONGEST)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(30):
        params = suggest(study.ask(), s)
        assert set(params) == set(DEFAULT_KNOBS)
        for d in s.dims:
            v = params[d.knob.name]
            if d.choices:
                assert v in d.choices
            else:
                assert d.low <= v <= d.high
        assert isinstance(params["max-num-seqs"], int) and isinstance(params["max-model-len"], int)
        # on CPU the fraction is log-scaled (no step): the flag carries 4 significant digits
        flag = from_cli_args(to_cli_args(params))["gpu-memory-utilization"]
        assert len(f"{flag:g}".replace("0.", "", 1).lstrip("0")) <= 4
        assert flag == pytest.approx(params["gpu-memory-utilization"], rel=1e-3)


def test_suggest_only_restricts_and_takes_enqueued_values():
    s = resolve(config(), cpu(), MODEL, LONGEST)
    study = optuna.create_study()
    study.enqueue_trial({"max-num-seqs": 16})
    assert suggest(study.ask(), s, only={"max-num-seqs"}) == {"max-num-seqs": 16}
    assert set(suggest(study.ask(), s, only={"kv-cache-dtype", "max-model-len"})) == {"kv-cache-dtype",
                                                                                      "max-model-len"}
