"""whatif/library.py and whatif/predict.py: aiconfigurator-core's estimate for a small model on a
device it has vLLM timings for (no GPU needed), the roofline where it has none, and the refusals."""

from __future__ import annotations

import pytest

from optimizer.errors import ConfigError
from optimizer.whatif import architecture, devices, library, roofline
from optimizer.whatif.predict import check_fits_somewhere, check_tp, predict

QWEN = "Qwen/Qwen3-0.6B"  # a config aiconfigurator-core ships


@pytest.fixture(scope="module")
def qwen():
    return architecture.load(QWEN)


def test_the_library_answers_for_a_covered_device_with_its_own_timings(qwen):
    h100 = devices.known("h100")
    p = predict(QWEN, qwen, h100, roofline.Serving(), roofline.Load(1024, 128, 8))
    assert p.by.startswith(f"aiconfigurator-core {library.version()} (vLLM ") and p.note == ""
    e = p.estimate
    assert e.fits and e.batch == 8 and 0 < e.ttft_s < 1 and 0 < e.tpot_s < 0.05
    assert e.throughput == pytest.approx(8 / e.tpot_s)
    # its own numbers, not the roofline's
    assert e.tpot_s != pytest.approx(roofline.estimate(qwen, h100, roofline.Serving(), roofline.Load(1024, 128, 8)).tpot_s)
    bigger = predict(QWEN, qwen, h100, roofline.Serving(), roofline.Load(1024, 128, 64)).estimate
    assert bigger.throughput > e.throughput  # a larger batch carries more


def test_a_device_the_library_has_no_timings_for_is_the_rooflines_and_says_why(qwen):
    l4 = devices.known("l4")
    p = predict(QWEN, qwen, l4, roofline.Serving(), roofline.Load(1024, 128, 8))
    assert p.by == "roofline" and p.note == "aiconfigurator-core has no vLLM timings for l4"
    assert p.estimate == roofline.estimate(qwen, l4, roofline.Serving(), roofline.Load(1024, 128, 8))


def test_a_model_the_library_cannot_build_falls_back_with_its_reason(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["NoSuchForCausalLM"], "num_attention_heads": 8, '
                                          '"hidden_size": 512, "num_hidden_layers": 2, "vocab_size": 1000}')
    arch = architecture.load(str(tmp_path))
    p = predict(str(tmp_path), arch, devices.known("h100"), roofline.Serving(), roofline.Load(128, 16, 1))
    assert p.by == "roofline" and p.note.startswith(f"aiconfigurator-core could not estimate {tmp_path} on h100: ")
    assert "\n" not in p.note


def test_a_tp_that_does_not_divide_the_heads_is_refused(qwen):
    check_tp(qwen, 8)
    with pytest.raises(ConfigError, match=r"TP 3 does not divide Qwen/Qwen3-0.6B's 16 attention heads and 8 KV "
                                          r"heads .* use one of 1, 2, 4, 8, 16$"):
        check_tp(qwen, 3)
    qwen7b = architecture.from_config("q", {"num_attention_heads": 28, "num_key_value_heads": 4, "hidden_size": 3584,
                                            "num_hidden_layers": 28, "vocab_size": 152064})
    with pytest.raises(ConfigError, match="TP 7 does not divide q's 28 attention heads and 4 KV heads"):
        check_tp(qwen7b, 7)  # 7 divides the 28 heads, but not the 4 KV heads, nor they it


def test_a_model_that_fits_at_no_tp_asked_names_the_smallest_that_fits():
    big = architecture.load("meta-llama/Meta-Llama-3.1-70B")
    check_fits_somewhere(big, devices.known("h200"), [1, 2], roofline.Serving(), roofline.Load(1999, 1, 1))
    with pytest.raises(ConfigError, match="does not fit h100 .* at TP 1 with a 2000-token request; the smallest TP "
                                          "that fits is 2: add it to --tp"):
        check_fits_somewhere(big, devices.known("h100"), [1], roofline.Serving(), roofline.Load(1999, 1, 1))


def test_the_library_is_never_handed_a_hub_id_to_fetch(qwen, monkeypatch, tmp_path):
    """A Hub id the library does not know by name goes to it as a local copy of the config read."""
    import urllib.request

    def no_network(*a, **k):
        raise AssertionError("the library reached for the network")
    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    model = "mistralai/Mixtral-8x7B-v0.1"  # a config it ships, but not a model it knows by id
    arch = architecture.load(model)
    p = predict(model, arch, devices.known("h100"), roofline.Serving(tp=2), roofline.Load(512, 64, 4))
    assert p.by.startswith("aiconfigurator-core") or p.note.startswith("aiconfigurator-core could not estimate")
    assert (tmp_path / "vllm-optimizer" / "whatif-configs" / "mistralai--Mixtral-8x7B-v0.1" / "config.json").is_file()


def test_a_burst_waits_for_its_place_among_the_prompts_sent_with_it(qwen):
    h100 = devices.known("h100")
    burst = predict(QWEN, qwen, h100, roofline.Serving(), roofline.Load(1024, 128, 32, burst=True))
    assert burst.by.startswith("aiconfigurator-core") and burst.estimate.batch == 32
    burst = burst.estimate
    assert burst.throughput == pytest.approx(32 * 128 / (burst.ttft_s / (33 / 64) + 128 * burst.tpot_s))
    two_waves = predict(QWEN, qwen, h100, roofline.Serving(max_num_seqs=16), roofline.Load(1024, 128, 32, burst=True))
    assert two_waves.estimate.batch == 16 and two_waves.estimate.ttft_s > burst.ttft_s


def test_an_fp8_checkpoint_and_cache_reach_the_library_as_fp8(qwen):
    from dataclasses import replace
    h100 = devices.known("h100")
    bf16 = predict(QWEN, qwen, h100, roofline.Serving(), roofline.Load(4096, 128, 64)).estimate
    fp8 = predict(QWEN, replace(qwen, quantization="fp8"), h100, roofline.Serving(kv_dtype="fp8"),
                  roofline.Load(4096, 128, 64)).estimate
    assert fp8.tpot_s < bf16.tpot_s  # half the bytes a step


def test_a_mixture_of_experts_is_answered_by_the_library():
    model = "Qwen/Qwen3-30B-A3B"
    arch = architecture.load(model)
    p = predict(model, arch, devices.known("h100"), roofline.Serving(), roofline.Load(1024, 128, 8))
    assert arch.experts and p.by.startswith("aiconfigurator-core"), p.note
