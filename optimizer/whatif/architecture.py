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
from functools import lru_cache
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
    shared_intermediate: int = 0  # shared experts' width, run for every token
    dense_layers: int = 0  # layers of a mixture of experts with a dense MLP instead

    @property
    def attention_params(self) -> int:
        """One layer's q, k, v, o."""
        return 2 * self.hidden * self.heads * self.head_dim + 2 * self.hidden * self.kv_heads * self.head_dim

    @property
    def mlp_params(self) -> int:
        """One layer's MLP as stored (a mixture of experts: every expert, the shared ones, the router)."""
        if self.experts:
            return (self.experts * self.expert_intermediate + self.shared_intermediate) * 3 * self.hidden \
                + self.hidden * self.experts
        return 3 * self.hidden * self.intermediate

    def mlp_params_active(self, tokens: float = 1) -> float:
        """One layer's MLP weights that `tokens` tokens in one step read: for a mixture of experts,
        the experts they route to, expected distinct (each token picks active of experts), the
        shared ones and the router."""
        if not self.experts:
            return 3 * self.hidden * self.intermediate
        distinct = self.experts * (1 - (1 - self.active_experts / self.experts) ** max(1.0, tokens))
        return (distinct * self.expert_intermediate + self.shared_intermediate) * 3 * self.hidden \
            + self.hidden * self.experts

    def _linear_width(self) -> float:
        return _WIDTH["fp8"] if self.quantization == "fp8" else _WIDTH.get(self.dtype, 2.0)

    def _mlp_width(self) -> float:
        return _WIDTH["mxfp4"] if self.quantization == "mxfp4" else self._linear_width()

    def _mlp_bytes(self, tokens: float | None) -> float:
        """Every layer's MLP bytes: stored (`tokens` None) or read by `tokens` tokens in one step. A
        mixture of experts may keep a dense MLP in its first layers (dense_layers)."""
        dense = 3 * self.hidden * self.intermediate * self._linear_width()
        if not self.experts:
            return self.layers * dense
        moe = (self.mlp_params if tokens is None else self.mlp_params_active(tokens)) * self._mlp_width()
        return (self.layers - self.dense_layers) * moe + self.dense_layers * dense

    @property
    def head_bytes(self) -> float:
        """The embedding and the LM head (kept at the activations' dtype)."""
        return (1 if self.tied else 2) * self.vocab * self.hidden * _WIDTH.get(self.dtype, 2.0)

    @property
    def weight_bytes(self) -> float:
        """Everything stored, every expert included."""
        return self.layers * self.attention_params * self._linear_width() + self._mlp_bytes(None) + self.head_bytes

    def bytes_read(self, tokens: float) -> float:
        """Weight bytes one forward step of `tokens` tokens reads (embedding excluded: a lookup)."""
        return (self.layers * self.attention_params * self._linear_width() + self._mlp_bytes(tokens)
                + self.vocab * self.hidden * _WIDTH.get(self.dtype, 2.0))

    def flops_per_token(self, context: float, logits: bool = True) -> float:
        """Multiply-adds x 2 of one token at `context` tokens of attention; with `logits`, its LM head
        (a prompt's tokens but the last skip it)."""
        mlp = (self.layers - self.dense_layers) * self.mlp_params_active(1) + self.dense_layers * 3 * self.hidden \
            * self.intermediate if self.experts else self.layers * self.mlp_params_active(1)
        head = self.vocab * self.hidden if logits else 0
        return 2 * (self.layers * self.attention_params + mlp + head) \
            + 4 * self.layers * self.heads * self.head_dim * context

    def kv_bytes_per_token(self, kv_dtype: str = "auto") -> float:
        width = 1.0 if kv_dtype.startswith("fp8") else _WIDTH.get(self.dtype, 2.0)
        return 2 * self.layers * self.kv_heads * self.head_dim * width

    @property
    def fp8_weights(self) -> bool:
        return self.quantization == "fp8"


def from_config(name: str, cfg: dict, hf_quant: dict | None = None) -> Architecture:
    """The architecture a config.json describes (and, for ModelOpt checkpoints, its
    hf_quant_config.json); ConfigError for what the estimate cannot model."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"what-if: config.json of {name} is not a JSON object; restore the model's config.json")
    quant = _quantization(name, cfg.get("quantization_config"), hf_quant)
    text = cfg.get("text_config") or cfg
    _refuse_layouts(name, text)
    try:
        heads, hidden = int(text["num_attention_heads"]), int(text["hidden_size"])
        if heads < 1 or hidden < 1:
            raise ValueError("num_attention_heads")
        experts = int(text.get("num_local_experts") or text.get("num_experts") or text.get("n_routed_experts") or 0)
        intermediate = int(text.get("intermediate_size") or 4 * hidden)
        dtype = str(text.get("torch_dtype") or cfg.get("torch_dtype") or text.get("dtype") or "bfloat16")
        dtype = "float16" if dtype == "float32" else dtype  # vLLM's dtype auto serves fp32 checkpoints in fp16
        expert_width = int(text.get("moe_intermediate_size") or intermediate) if experts else 0
        shared = int(text.get("shared_expert_intermediate_size") or 0) or \
            int(text.get("n_shared_experts") or 0) * expert_width
        dense = int(text.get("first_k_dense_replace") or 0) + len(text.get("mlp_only_layers") or [])
        return Architecture(
            name=name, layers=int(text["num_hidden_layers"]), heads=heads,
            kv_heads=int(text.get("num_key_value_heads") or heads),
            head_dim=int(text.get("head_dim") or hidden // heads), hidden=hidden, intermediate=intermediate,
            vocab=int(text["vocab_size"]), tied=bool(text.get("tie_word_embeddings", cfg.get("tie_word_embeddings"))),
            dtype=dtype if dtype in _WIDTH else "bfloat16", quantization=quant, experts=experts,
            active_experts=int(text.get("num_experts_per_tok") or 0) if experts else 0,
            expert_intermediate=expert_width, shared_intermediate=shared if experts else 0,
            dense_layers=dense if experts else 0)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"what-if: config.json of {name} lacks a usable {exc}; is it a decoder LLM?") from None


def _refuse_layouts(name: str, text: dict) -> None:
    """Layouts the arithmetic above would get wrong, refused rather than mis-modelled."""
    why = ("multi-head latent attention" if text.get("kv_lora_rank") else
           "Llama 4's layout (an always-on shared expert beside the routed ones, experts in some layers)"
           if str(text.get("model_type") or "").startswith("llama4") else
           "a mixture of experts without num_experts_per_tok" if (text.get("num_local_experts") or
                                                                 text.get("num_experts") or text.get("n_routed_experts"))
           and not text.get("num_experts_per_tok") else
           "experts in only some layers" if int(text.get("interleave_moe_layer_step") or 1) > 1
           or int(text.get("decoder_sparse_step") or 1) > 1 else "")
    if why:
        raise ConfigError(f"what-if: {name} has {why}, which the estimate does not model; plan a model without it, "
                          "or measure it with a study")


def _quantization(name: str, q: dict | None, hf_quant: dict | None) -> str:
    if not q and not hf_quant:
        return ""
    q = q or {"quant_method": "modelopt", **((hf_quant or {}).get("quantization") or {})}
    method = str(q.get("quant_method") or "").lower()
    algo = str(q.get("quant_algo") or (((hf_quant or {}).get("quantization") or {}).get("quant_algo")) or "").upper()
    if method in ("fp8", "fbgemm_fp8") or (method == "modelopt" and algo == "FP8") or \
            (method == "compressed-tensors" and _float8(q)):
        return "fp8"
    if method == "mxfp4":
        return "mxfp4"
    what = f"{method} {algo}".strip() if method == "modelopt" else method
    raise ConfigError(f"what-if: {name} is quantized with {what or 'an unnamed method'}, which the estimate does "
                      "not model (it models bf16/fp16, fp8 and mxfp4 weights); plan a bf16 or fp8 checkpoint of it")


def _float8(q: dict) -> bool:
    """A compressed-tensors config whose weights are 8-bit floats (how llm-compressor writes FP8)."""
    groups = (q.get("config_groups") or {}).values()
    weights = [g.get("weights") or {} for g in groups if isinstance(g, dict)]
    return bool(weights) and all(w.get("type") == "float" and w.get("num_bits") == 8 for w in weights)


def bundled_config(model_id: str, suffix: str = "config") -> Path | None:
    """aiconfigurator-core's copy of a model's config.json (`suffix` hf_quant_config: its
    hf_quant_config.json), when it ships one (no network)."""
    try:
        import aiconfigurator_core  # noqa: PLC0415
    except ImportError:
        return None
    path = Path(aiconfigurator_core.__file__).parent / "model_configs" / f"{model_id.replace('/', '--')}_{suffix}.json"
    return path if path.is_file() else None


def _json(file: Path, name: str):
    try:
        return json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"what-if: {file} of {name} cannot be read as JSON ({type(exc).__name__}); restore it") \
            from None


@lru_cache(maxsize=64)
def read(source: str) -> tuple[dict, dict | None]:
    """config.json and hf_quant_config.json (None without one) of a local model directory, a
    bundled config, or a Hub id (its config.json only: the Hub, then its cache)."""
    path = Path(source).expanduser()
    if path.is_dir() or path.is_file():
        file = path / "config.json" if path.is_dir() else path
        if not file.is_file():
            raise ConfigError(f"what-if: {path} has no config.json; point at a Hugging Face model directory")
        quant = file.parent / "hf_quant_config.json"
        return _json(file, source), (_json(quant, source) if quant.is_file() else None)
    bundled = bundled_config(source)
    if bundled is not None:
        quant = bundled_config(source, "hf_quant_config")
        return _json(bundled, source), (_json(quant, source) if quant else None)
    return read_config(source), None


def load(source: str) -> Architecture:
    """The architecture of a local model directory, a bundled config, or a Hub id's config.json."""
    cfg, hf_quant = read(source)
    return from_config(source, cfg, hf_quant)
