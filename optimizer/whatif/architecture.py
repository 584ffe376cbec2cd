"""A model's shape as the what-if estimate needs it, read from its config.json: what is stored
(for memory), what one token reads and multiplies with (for speed), and what one token's KV takes.

Per layer: attention has q and o of hidden x heads x head_dim each and k, v of hidden x kv_heads x
head_dim each (head_dim is not always hidden / heads: Qwen3-32B has 64 heads of 128 on a hidden of
5120). The MLP is gated (3 matrices) of `intermediate`, or, for a mixture of experts, `experts`
such MLPs of `expert_intermediate` of which `active_experts` run for each token. The embedding is
a lookup (stored, not multiplied); the LM head is a matmul, stored apart unless tied.

Weights are stored at the config's dtype, fp8 (1 byte a weight: fp8 checkpoints) or mxfp4 (4.25
bits a weight in the experts, the rest bf16: gpt-oss). Other quantizations (AWQ, GPTQ, bitsandbytes,
...) are refused: their kernels' speed is not this arithmetic.

Where config.json comes from: a local directory, the configs aiconfigurator-core ships for the
models it knows (no network), or the Hugging Face Hub and its cache (config/model_info.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from optimizer.config.model_info import read_config
from optimizer.errors import ConfigError

_WIDTH = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "fp8": 1.0, "mxfp4": 4.25 / 8}
QUANTIZATIONS = ("fp8", "mxfp4")  # besides none


@dataclass(frozen=True)
class Architecture:
    name: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int  # the dense MLP's width (unused when every layer is a mixture of experts)
    vocab: int
    tied: bool = False
    dtype: str = "bfloat16"  # activations, attention and the KV cache's "auto"
    quantization: str = ""  # "", "fp8" (every linear layer), "mxfp4" (the experts)
    experts: int = 0  # 0: dense
    active_experts: int = 0
    expert_intermediate: int = 0

    @property
    def attention_params(self) -> int:
        """One layer's q, k, v, o."""
        return 2 * self.hidden * self.heads * self.head_dim + 2 * self.hidden * self.kv_heads * self.head_dim

    @property
    def mlp_params(self) -> int:
        """One layer's MLP as stored (every expert)."""
        if self.experts:
            return self.experts * 3 * self.hidden * self.expert_intermediate + self.hidden * self.experts
        return 3 * self.hidden * self.intermediate

    def mlp_params_active(self, tokens: float = 1) -> float:
        """One layer's MLP weights that `tokens` tokens in one step read: for a mixture of experts,
        the experts they route to, expected distinct (each token picks active of experts)."""
        if not self.experts:
            return 3 * self.hidden * self.intermediate
        distinct = self.experts * (1 - (1 - self.active_experts / self.experts) ** max(1.0, tokens))
        return distinct * 3 * self.hidden * self.expert_intermediate + self.hidden * self.experts

    def _linear_width(self) -> float:
        return _WIDTH["fp8"] if self.quantization == "fp8" else _WIDTH.get(self.dtype, 2.0)

    def _mlp_width(self) -> float:
        return _WIDTH["mxfp4"] if self.quantization == "mxfp4" else self._linear_width()

    @property
    def head_bytes(self) -> float:
        """The embedding and the LM head (kept at the activations' dtype)."""
        return (1 if self.tied else 2) * self.vocab * self.hidden * _WIDTH.get(self.dtype, 2.0)

    @property
    def weight_bytes(self) -> float:
        """Everything stored, every expert included."""
        per_layer = self.attention_params * self._linear_width() + self.mlp_params * self._mlp_width()
        return self.layers * per_layer + self.head_bytes

    def bytes_read(self, tokens: float) -> float:
        """Weight bytes one forward step of `tokens` tokens reads (embedding excluded: a lookup)."""
        per_layer = (self.attention_params * self._linear_width()
                     + self.mlp_params_active(tokens) * self._mlp_width())
        return self.layers * per_layer + self.vocab * self.hidden * _WIDTH.get(self.dtype, 2.0)

    def flops_per_token(self, context: float) -> float:
        """Multiply-adds x 2 of one token at `context` tokens of attention (the LM head included)."""
        active = self.attention_params + self.mlp_params_active(1)
        return 2 * (self.layers * active + self.vocab * self.hidden) + 4 * self.layers * self.heads * self.head_dim * context

    def kv_bytes_per_token(self, kv_dtype: str = "auto") -> float:
        width = 1.0 if kv_dtype.startswith("fp8") else _WIDTH.get(self.dtype, 2.0)
        return 2 * self.layers * self.kv_heads * self.head_dim * width

    @property
    def fp8_weights(self) -> bool:
        return self.quantization == "fp8"


def from_config(name: str, cfg: dict) -> Architecture:
    """The architecture a config.json describes; ConfigError for what the estimate cannot model."""
    quant = _quantization(name, cfg.get("quantization_config"))
    text = cfg.get("text_config") or cfg
    try:
        heads, hidden = int(text["num_attention_heads"]), int(text["hidden_size"])
        experts = int(text.get("num_local_experts") or text.get("num_experts") or text.get("n_routed_experts") or 0)
        intermediate = int(text.get("intermediate_size") or 4 * hidden)
        dtype = str(text.get("torch_dtype") or cfg.get("torch_dtype") or text.get("dtype") or "bfloat16")
        return Architecture(
            name=name, layers=int(text["num_hidden_layers"]), heads=heads,
            kv_heads=int(text.get("num_key_value_heads") or heads),
            head_dim=int(text.get("head_dim") or hidden // heads), hidden=hidden, intermediate=intermediate,
            vocab=int(text["vocab_size"]), tied=bool(text.get("tie_word_embeddings", cfg.get("tie_word_embeddings"))),
            dtype=dtype if dtype in _WIDTH else "bfloat16", quantization=quant, experts=experts,
            active_experts=int(text.get("num_experts_per_tok") or 0) if experts else 0,
            expert_intermediate=int(text.get("moe_intermediate_size") or intermediate) if experts else 0)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"what-if: config.json of {name} lacks a usable {exc}; is it a decoder LLM?") from None


def _quantization(name: str, q: dict | None) -> str:
    if not q:
        return ""
    method = str(q.get("quant_method") or "").lower()
    if method in ("fp8", "fbgemm_fp8", "modelopt") or (method == "compressed-tensors" and _float8(q)):
        return "fp8"
    if method == "mxfp4":
        return "mxfp4"
    raise ConfigError(f"what-if: {name} is quantized with {method or 'an unnamed method'}, which the estimate does "
                      "not model (it models bf16/fp16, fp8 and mxfp4 weights); plan a bf16 or fp8 checkpoint of it")


def _float8(q: dict) -> bool:
    """A compressed-tensors config whose weights are 8-bit floats (how llm-compressor writes FP8)."""
    groups = (q.get("config_groups") or {}).values()
    weights = [g.get("weights") or {} for g in groups if isinstance(g, dict)]
    return bool(weights) and all(w.get("type") == "float" and w.get("num_bits") == 8 for w in weights)


def bundled_config(model_id: str) -> Path | None:
    """aiconfigurator-core's copy of a model's config.json, when it ships one (no network)."""
    try:
        import aiconfigurator_core  # noqa: PLC0415
    except ImportError:
        return None
    path = Path(aiconfigurator_core.__file__).parent / "model_configs" / f"{model_id.replace('/', '--')}_config.json"
    return path if path.is_file() else None


def load(source: str) -> Architecture:
    """The architecture of a local model directory, a bundled config, or a Hub id's config.json."""
    path = Path(source).expanduser()
    if path.is_dir() or path.is_file():
        file = path / "config.json" if path.is_dir() else path
        if not file.is_file():
            raise ConfigError(f"what-if: {path} has no config.json; point at a Hugging Face model directory")
        return from_config(source, json.loads(file.read_text()))
    bundled = bundled_config(source)
    if bundled is not None:
        return from_config(source, json.loads(bundled.read_text()))
    return from_config(source, read_config(source))
