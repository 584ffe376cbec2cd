"""whatif/architecture.py: a model's stored and read bytes, FLOPs and KV from its config.json,
checked against the parameter counts the model makers publish."""

from __future__ import annotations

import json

import pytest

from optimizer.errors import ConfigError
from optimizer.whatif import architecture
from optimizer.whatif.architecture import from_config


def test_qwen3_32b_has_heads_wider_than_its_hidden_and_its_published_size():
    a = architecture.load("Qwen/Qwen3-32B")  # the config aiconfigurator-core ships: no network
    assert (a.heads, a.head_dim, a.hidden, a.kv_heads) == (64, 128, 5120, 8)
    assert a.attention_params == 2 * 5120 * 64 * 128 + 2 * 5120 * 8 * 128  # q and o are 8192 wide, not 5120
    assert a.weight_bytes / 2 == pytest.approx(32.8e9, rel=0.02)  # Qwen's model card: 32.8B parameters


def test_llama_70b_is_141_gb_in_bf16_and_70_in_fp8():
    a = architecture.load("meta-llama/Meta-Llama-3.1-70B")
    assert a.weight_bytes == pytest.approx(141e9, rel=0.01) and not a.fp8_weights
    fp8 = from_config("x", {**json.loads(architecture.bundled_config("meta-llama/Meta-Llama-3.1-70B").read_text()),
                            "quantization_config": {"quant_method": "fp8"}})
    assert fp8.fp8_weights and fp8.weight_bytes == pytest.approx(70.6e9 + 128256 * 8192 * 2, rel=0.01)


def test_a_mixture_of_experts_stores_every_expert_and_reads_those_its_tokens_route_to():
    a = architecture.load("openai/gpt-oss-120b")  # 128 experts, 4 a token, mxfp4 experts
    assert (a.experts, a.active_experts, a.quantization) == (128, 4, "mxfp4")
    one = a.mlp_params_active(1)
    assert one == pytest.approx(4 * 3 * 2880 * 2880 + 2880 * 128)
    assert a.mlp_params_active(64) > 20 * one  # 64 tokens touch most experts
    assert a.mlp_params_active(10_000) == pytest.approx(a.mlp_params, rel=1e-6)
    assert 55e9 < a.weight_bytes < 70e9  # the published checkpoint is about 65 GB


def test_kv_bytes_follow_the_kv_heads_and_the_cache_dtype():
    a = from_config("m", {"num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
                          "num_hidden_layers": 32, "vocab_size": 128256, "intermediate_size": 14336})
    assert a.kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2 and a.kv_bytes_per_token("fp8") == 2 * 32 * 8 * 128


def test_fp8_checkpoints_are_recognised_however_they_say_it():
    base = {"num_attention_heads": 8, "hidden_size": 512, "num_hidden_layers": 2, "vocab_size": 1000}
    for q in ({"quant_method": "fp8"}, {"quant_method": "fbgemm_fp8"},
              {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"type": "float", "num_bits": 8}}}}):
        assert from_config("m", {**base, "quantization_config": q}).quantization == "fp8"
    int8 = {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"type": "int", "num_bits": 8}}}}
    with pytest.raises(ConfigError, match="quantized with compressed-tensors, which the estimate does not model"):
        from_config("m", {**base, "quantization_config": int8})


def test_a_vision_models_text_config_is_the_one_read(tmp_path):
    cfg = {"architectures": ["MllamaForConditionalGeneration"],
           "text_config": {"num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
                           "num_hidden_layers": 40, "vocab_size": 128256, "intermediate_size": 14336}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    a = architecture.load(str(tmp_path))
    assert (a.layers, a.hidden, a.kv_heads) == (40, 4096, 8)


def test_what_cannot_be_read_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="has no config.json; point at a Hugging Face model directory"):
        architecture.load(str(tmp_path))
    with pytest.raises(ConfigError, match="lacks a usable 'vocab_size'; is it a decoder LLM"):
        from_config("m", {"num_attention_heads": 8, "hidden_size": 512, "num_hidden_layers": 2})


BASE = {"num_attention_heads": 8, "hidden_size": 512, "num_hidden_layers": 4, "vocab_size": 1000,
        "intermediate_size": 1024}


@pytest.mark.parametrize("extra, why", [
    ({"kv_lora_rank": 512}, "multi-head latent attention"),
    ({"n_routed_experts": 64}, "a mixture of experts without num_experts_per_tok"),
    ({"num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2}, "experts in only some layers"),
    ({"model_type": "llama4_text", "num_local_experts": 16, "num_experts_per_tok": 1}, r"Llama 4's layout \(an always-on"
     r" shared expert beside the routed ones, experts in some layers\)"),
])
def test_layouts_the_arithmetic_would_get_wrong_are_refused(extra, why):
    with pytest.raises(ConfigError, match=f"has {why}, which the estimate does not model"):
        from_config("m", {**BASE, **extra})


def test_nvfp4_is_refused_whether_in_config_or_in_hf_quant_config():
    with pytest.raises(ConfigError, match="quantized with modelopt NVFP4, which the estimate does not model"):
        from_config("m", {**BASE, "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}})
    with pytest.raises(ConfigError, match="quantized with modelopt NVFP4"):
        from_config("m", BASE, {"quantization": {"quant_algo": "NVFP4"}})
    assert from_config("m", BASE, {"quantization": {"quant_algo": "FP8"}}).quantization == "fp8"


def test_shared_experts_and_dense_first_layers_are_counted():
    moe = {**BASE, "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 256}
    plain = from_config("m", moe)
    shared = from_config("m", {**moe, "n_shared_experts": 1, "first_k_dense_replace": 1})
    assert shared.mlp_params - plain.mlp_params == 3 * 512 * 256  # one shared expert a layer
    assert shared.dense_layers == 1
    # 3 MoE layers (with the shared expert) and 1 dense layer of 1024, at 2 bytes
    assert shared.weight_bytes - shared.head_bytes == pytest.approx(
        (4 * shared.attention_params + 3 * shared.mlp_params + 3 * 512 * 1024) * 2)


def test_a_float32_checkpoint_is_served_at_16_bits():
    assert from_config("m", {**BASE, "torch_dtype": "float32"}).kv_bytes_per_token() == 2 * 4 * 8 * 64 * 2
