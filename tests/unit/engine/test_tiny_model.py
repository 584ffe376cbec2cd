"""engine/tiny_model.py + config/model_info.py: the demo model is reproducible and reads back as the sizes it promises."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from optimizer.config.model_info import load_model_info
from optimizer.engine.tiny_model import write_tiny_model
from optimizer.errors import ConfigError


def test_two_writes_are_byte_identical(tmp_path, tiny_model):
    # the second one in another process (`python -m optimizer tiny-model DIR`): hash seeds differ
    out = subprocess.run([sys.executable, "-m", "optimizer", "tiny-model", str(tmp_path / "again")],
                         capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "123"})
    other = Path(out.stdout.strip())
    assert other == (tmp_path / "again").resolve()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (other / name).read_bytes() == (tiny_model / name).read_bytes(), name


def test_config_has_the_documented_shape(tiny_model):
    cfg = json.loads((tiny_model / "config.json").read_text())
    assert (cfg["head_dim"], cfg["num_hidden_layers"], cfg["num_key_value_heads"]) == (64, 8, 8)
    assert cfg["max_position_embeddings"] == 65536
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    tok = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    assert tok.get_vocab_size() <= cfg["vocab_size"] and cfg["vocab_size"] % 64 == 0
    assert [tok.token_to_id(t) for t in ("<unk>", "<s>", "</s>")] == [0, 1, 2]


def test_existing_model_is_left_as_it_is(tiny_model):
    before = {p.name: p.stat().st_mtime_ns for p in tiny_model.iterdir()}
    assert write_tiny_model(tiny_model) == tiny_model
    assert {p.name: p.stat().st_mtime_ns for p in tiny_model.iterdir()} == before


def test_model_info_kv_bytes_per_token(tiny_model):
    info = load_model_info(str(tiny_model))
    assert info.source == str(tiny_model) and info.dtype == "bfloat16"
    assert info.kv_bytes_per_token() == 16384  # 2 (K, V) x 8 layers x 8 heads x 64 x 2 bytes
    assert info.kv_bytes_per_token("fp8") == 8192
    assert info.kv_bytes_per_token("fp8_e4m3") == 8192
    assert load_model_info(str(tiny_model), dtype="float32").kv_bytes_per_token() == 32768


def test_missing_directory_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_model_info(str(tmp_path / "no-such-model"))


def test_directory_without_config_json_is_a_config_error(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ConfigError, match="no config.json"):
        load_model_info(str(tmp_path))


def test_config_json_that_is_not_a_decoder_is_a_config_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "resnet", "num_channels": 3}))
    with pytest.raises(ConfigError, match="lacks a usable"):
        load_model_info(str(tmp_path))


def test_never_writes_into_a_directory_holding_something_else(tmp_path):
    from optimizer.errors import ConfigError

    own = tmp_path / "my-model"
    own.mkdir()
    (own / "tokenizer.model").write_bytes(b"precious")
    with pytest.raises(ConfigError, match="not empty"):
        write_tiny_model(own)
    assert sorted(p.name for p in own.iterdir()) == ["tokenizer.model"]


def test_weights_are_seeded_shaped_for_the_config_and_at_llamas_init_scale(tmp_path):
    from safetensors.torch import load_file

    from optimizer.engine.tiny_model import INIT_STD, LAYERS, write_tiny_model

    a = write_tiny_model(tmp_path / "a", weights=True)
    b = write_tiny_model(tmp_path / "b", weights=True)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()  # seeded
    cfg = json.loads((a / "config.json").read_text())
    w = load_file(str(a / "model.safetensors"))
    assert len(w) == 3 + 9 * LAYERS
    assert tuple(w["lm_head.weight"].shape) == (cfg["vocab_size"], cfg["hidden_size"])
    assert tuple(w["model.layers.0.self_attn.q_proj.weight"].shape) == (
        cfg["num_attention_heads"] * cfg["head_dim"], cfg["hidden_size"])
    assert tuple(w["model.layers.7.mlp.down_proj.weight"].shape) == (cfg["hidden_size"], cfg["intermediate_size"])
    assert abs(w["lm_head.weight"].float().std().item() - INIT_STD) < 0.001
    assert w["model.norm.weight"].float().eq(1).all()
    # A dummy-weights directory has none until asked; asking again on a complete one is a no-op.
    c = write_tiny_model(tmp_path / "c")
    assert not (c / "model.safetensors").exists()
    assert write_tiny_model(c, weights=True) == c
    assert (c / "model.safetensors").read_bytes() == (a / "model.safetensors").read_bytes()
    assert write_tiny_model(a, weights=True) == a


def test_memory_fraction_leaves_the_asked_kv_cache_beside_the_measured_non_kv_memory():
    from optimizer.engine.device import GIB
    from optimizer.engine.tiny_model import NON_KV_GIB
    from optimizer.testing.memory import memory_fraction

    assert memory_fraction(0.5, total_bytes=int(14.7 * GIB)) == round((NON_KV_GIB + 0.5) / 14.7, 3)
    assert memory_fraction(0.8, total_bytes=int(8.21 * GIB)) == 0.216
