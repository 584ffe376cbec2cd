"""Speculative decoding's configuration: the `speculative-config` knob, and a `--speculative-config`
in `engine.extra_args`, both checked before anything boots.

The knob is categorical: "off" (no flag) or the JSON text vLLM takes. Its default choices are off
and n-gram proposals of 2 and 4 tokens (lookup 2-4): n-gram needs no second model and no memory
beyond the target's, so every draw can start on any device. Other methods (a draft model, EAGLE
heads, MTP) go in the knob's `choices` with their paths; the KV precheck does not count a draft
model's memory.

vLLM reads the flag's JSON only once a server starts, minutes into a trial on a GPU; a typo there
would fail every trial the same way. The checks here are the ones vLLM 0.32 makes at start, and
what it does not check but cannot run:

- the value is one JSON object;
- `method` is one vLLM knows (METHODS, from vllm/config/speculative.py's `SpeculativeMethod`);
  left out, vLLM infers it from a draft `model`, so one of the two is needed;
- `num_speculative_tokens`, `prompt_lookup_min` and `prompt_lookup_max` are whole numbers >= 1,
  and the lookup's min is not above its max;
- a method that drafts with a second model (DRAFT_MODEL_METHODS) names it in `model`; a local
  draft directory must share the target's vocabulary (a draft's tokens are the target's);
- `suffix` needs the package `arctic-inference` (vLLM imports it at start).

Each failure is one line (ConfigError, exit 2) naming the fix.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from optimizer.errors import ConfigError

FLAG = "--speculative-config"
KNOB = FLAG.removeprefix("--")
OFF = "off"
METHODS = ("ngram", "ngram_gpu", "medusa", "mlp_speculator", "draft_model", "suffix", "custom_class", "eagle",
           "eagle3", "extract_hidden_states", "mtp", "dflash", "dspark")
# The model-specific MTP names (deepseek_mtp, qwen3_next_mtp, ...) end in _mtp: all accepted as MTP.
DRAFT_MODEL_METHODS = ("draft_model", "eagle", "eagle3", "medusa", "mlp_speculator", "dflash", "dspark")
DEFAULT_CHOICES = (OFF, *(json.dumps({"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4,
                                     "prompt_lookup_min": 2}) for k in (2, 4)))
EXAMPLE = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}'


def given(args: list[str]) -> str | None:
    """The flag's value in `args` (`--speculative-config X` or `--speculative-config=X`), or None."""
    for i, arg in enumerate(args):
        if arg == FLAG:
            return args[i + 1] if i + 1 < len(args) else ""
        if arg.startswith(FLAG + "="):
            return arg.partition("=")[2]
    return None


def check_args(args: list[str], where: str, target_vocab: int | None = None) -> dict | None:
    """The parsed speculative config in `args` after its checks, or None when there is none."""
    text = given(args)
    return None if text is None else check(text, f"{where} {FLAG}", target_vocab)


def choice(value, where: str) -> str:
    """One of the knob's choices as given: "off", or a config that passes `check`."""
    if value == OFF:
        return OFF
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {value!r}: give \"off\" or the JSON text of a speculative config, quoted, "
                          f"e.g. '{EXAMPLE}'")
    check(value, f"{where} {value}")
    return value


def check(text: str, where: str, target_vocab: int | None = None) -> dict:
    try:
        cfg = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{where}: not JSON ({exc.msg} at character {exc.pos}); give one JSON object, "
                          f"e.g. '{EXAMPLE}'") from exc
    if not isinstance(cfg, dict):
        raise ConfigError(f"{where}: give one JSON object, not {type(cfg).__name__}, e.g. '{EXAMPLE}'")
    method = cfg.get("method")
    if method is None and not cfg.get("model"):
        raise ConfigError(f"{where}: give \"method\" (e.g. \"ngram\"), or a draft \"model\" for vLLM to infer it from")
    if method is not None and method not in METHODS and not str(method).endswith("_mtp"):
        raise ConfigError(f"{where}: unknown method {method!r}; vLLM knows {', '.join(METHODS)} "
                          "and the model-specific *_mtp ones")
    for key in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"):
        value = cfg.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{where}: {key} is {value!r}; give a whole number of at least 1")
    low, high = cfg.get("prompt_lookup_min"), cfg.get("prompt_lookup_max")
    if low is not None and high is not None and low > high:
        raise ConfigError(f"{where}: prompt_lookup_min ({low}) is above prompt_lookup_max ({high}); "
                          "the n-gram lookup needs min <= max")
    if method in DRAFT_MODEL_METHODS and not cfg.get("model"):
        raise ConfigError(f"{where}: method {method!r} drafts with a second model; give its path or "
                          "Hugging Face id as \"model\"")
    if method == "suffix" and importlib.util.find_spec("arctic_inference") is None:
        raise ConfigError(f"{where}: method 'suffix' needs the package arctic-inference; "
                          "run `pip install arctic-inference`, or use method 'ngram'")
    _same_vocabulary(cfg.get("model"), target_vocab, where)
    return cfg


def _same_vocabulary(draft: str | None, target_vocab: int | None, where: str) -> None:
    """A local draft directory's vocabulary against the target's (a Hub id is vLLM's to check)."""
    if not draft or target_vocab is None or not (Path(draft) / "config.json").is_file():
        return
    try:
        vocab = json.loads((Path(draft) / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError):
        return  # an unreadable config is vLLM's to report, with its own words
    if isinstance(vocab, int) and vocab != target_vocab:
        raise ConfigError(f"{where}: the draft model {draft} has a vocabulary of {vocab} tokens, the target "
                          f"{target_vocab}; a draft must share the target's tokenizer: pick a draft of the same "
                          "family")
