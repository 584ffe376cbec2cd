"""Facts about the model that the search space and the workload need, read from its config.json.

`--model` is a local directory or a Hugging Face id. For an id, config.json comes from
the local Hugging Face cache or the Hub (one small file, never the weights). A model that
cannot be found is a ConfigError raised at the door, before anything is written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from optimizer.errors import ConfigError

_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1}


@dataclass(frozen=True)
class ModelInfo:
    source: str  # what is passed to vLLM's --model
    layers: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab_size: int
    max_positions: int
    dtype: str

    def kv_bytes_per_token(self, kv_cache_dtype: str = "auto") -> int:
        """Bytes of KV cache one token takes (K and V, every layer)."""
        width = 1 if kv_cache_dtype.startswith("fp8") else _DTYPE_BYTES.get(self.dtype, 2)
        return 2 * self.layers * self.kv_heads * self.head_dim * width

    def weight_bytes(self) -> int:
        """Rough size of the weights (attention + MLP + embeddings), for memory ranges."""
        attn = self.hidden * self.hidden * 2 + self.hidden * self.kv_heads * self.head_dim * 2
        mlp = 3 * self.hidden * self.intermediate
        embed = 2 * self.vocab_size * self.hidden
        return (self.layers * (attn + mlp) + embed) * _DTYPE_BYTES.get(self.dtype, 2)


def _read_config(source: str) -> dict:
    path = Path(source).expanduser()
    if path.is_dir():
        cfg = path / "config.json"
        if not cfg.is_file():
            raise ConfigError(f"model: {path} has no config.json; point --model at a Hugging Face model directory")
        try:
            data = json.loads(cfg.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"model: {cfg} is not valid JSON; restore the model's config.json") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"model: {cfg} is not a JSON object; restore the model's config.json")
        return data
    looks_local = source.startswith(("/", ".", "~")) or path.exists()
    if looks_local or not _HF_ID.match(source):
        raise ConfigError(
            f"model: directory {source} does not exist; pass an existing model directory, "
            "a Hugging Face id (org/name), or run `python -m optimizer tiny-model DIR` first"
        )
    try:
        from huggingface_hub import hf_hub_download

        return json.loads(Path(hf_hub_download(source, "config.json")).read_text())
    except Exception as exc:  # network errors, unknown repo, gated repo: all one answer
        raise ConfigError(
            f"model: cannot read config.json of Hugging Face model {source} ({type(exc).__name__}); "
            "check the id and network access, or pass a local directory"
        ) from exc


def load_model_info(source: str, dtype: str = "auto") -> ModelInfo:
    """Read the model's architecture; raises ConfigError when the model cannot be found."""
    cfg = _read_config(source)
    cfg = cfg.get("text_config", cfg)
    try:
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        info = ModelInfo(
            source=str(Path(source).expanduser().resolve()) if Path(source).expanduser().is_dir() else source,
            layers=int(cfg["num_hidden_layers"]),
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            hidden=hidden,
            intermediate=int(cfg.get("intermediate_size") or 4 * hidden),
            vocab_size=int(cfg["vocab_size"]),
            max_positions=int(cfg.get("max_position_embeddings") or 2048),
            dtype=(dtype if dtype != "auto" else str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"model: config.json of {source} lacks a usable {exc}; is it a decoder LLM?") from exc
    return info
