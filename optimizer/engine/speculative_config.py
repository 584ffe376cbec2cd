"""Speculative decoding's configuration: the `speculative-config` knob, and a `--speculative-config`
in `engine.extra_args`, both checked before anything boots.

The knob is categorical: "off" (no flag) or the JSON text vLLM takes. Its choices are given in
`space`, or built from config `speculation:` by `sub_space` (off, then each method that can run
here with each draft length; what cannot run is left out with a note). Without that section they
are off and n-gram proposals of 2 and 4 tokens (lookup 2-4): n-gram needs no second model and no
memory beyond the target's, so every draw can start on any device. A local draft model's memory
is counted by the KV precheck (config/kv_fit.py).

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
    _check_schedule(cfg.get("num_speculative_tokens_per_batch_size"), where)
    if method in DRAFT_MODEL_METHODS and not cfg.get("model"):
        raise ConfigError(f"{where}: method {method!r} drafts with a second model; give its path or "
                          "Hugging Face id as \"model\"")
    if method == "suffix" and importlib.util.find_spec("arctic_inference") is None:
        raise ConfigError(f"{where}: method 'suffix' needs the package arctic-inference; "
                          "run `pip install arctic-inference`, or use method 'ngram'")
    _same_vocabulary(cfg.get("model"), target_vocab, where)
    return cfg


def _check_schedule(schedule, where: str) -> None:
    """vLLM's rules for a per-batch-size schedule: [start, end, tokens] rows, whole numbers, start <= end,
    tokens >= 0, ranges that do not overlap, the first starting at batch size 1."""
    if schedule is None:
        return
    key = "num_speculative_tokens_per_batch_size"
    rows = schedule if isinstance(schedule, list) else None
    if not rows or any(not isinstance(r, list) or len(r) != 3 or any(isinstance(x, bool) or not isinstance(x, int)
                                                                    for x in r) for r in rows):
        raise ConfigError(f"{where}: {key} is {schedule!r}; give [start, end, tokens] rows of whole numbers, "
                          "e.g. [[1, 8, 4], [9, 256, 0]]")
    end = 0
    for start, stop, tokens in sorted(rows):
        if start < 1 or start > stop or tokens < 0:
            raise ConfigError(f"{where}: {key} row {[start, stop, tokens]}: give 1 <= start <= end and tokens >= 0")
        if start <= end:
            raise ConfigError(f"{where}: {key}: the ranges overlap at batch size {start}; make them disjoint")
        end = stop
    if min(r[0] for r in rows) != 1:
        raise ConfigError(f"{where}: {key}: the first range must start at batch size 1 (every batch size needs a "
                          "draft length)")


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


# ---- the knob's sub-space (config `speculation:`) ------------------------------------------------------

# Each method and what it needs beyond vLLM; `sub_space` leaves out what cannot run, with the fix.
SUB_SPACE_METHODS = ("ngram", "suffix", "mtp", "draft_model", "eagle", "eagle3")
_PATH_OF = {"draft_model": "draft_model", "eagle": "eagle_head", "eagle3": "eagle3_head"}


def sub_space(spec, model_dir: str, target_vocab: int | None) -> tuple[tuple[str, ...], str | None]:
    """The knob's choices for config `speculation:` (schema.SpeculationSpec): off, then each method that
    can run here with each draft length (n-gram: each lookup window; with `per_batch_size`, each draft
    length also only up to that many running sequences). Returns the choices and a note naming the
    methods left out and why; a method the config names that cannot run is a ConfigError."""
    asked = spec.methods
    for m in asked or ():
        if m not in SUB_SPACE_METHODS:
            raise ConfigError(f"speculation.methods: unknown method {m!r}; give some of {', '.join(SUB_SPACE_METHODS)}")
    left_out, choices = [], [OFF]
    for method in SUB_SPACE_METHODS if asked is None else asked:
        why = _cannot_run(method, spec, model_dir)
        if why and asked is not None:
            raise ConfigError(f"speculation.methods: {method} cannot run here: {why}")
        if why:
            left_out.append(f"{method} ({why})")
            continue
        for cfg in _configs(method, spec):
            choices.append(json.dumps(cfg))
    for text in choices[1:]:
        check(text, "speculation", target_vocab)
    searched = sorted({json.loads(c)["method"] for c in choices[1:]})
    note = (f"speculative-config: off and {', '.join(searched) or 'nothing else'} searched; left out: "
            f"{'; '.join(left_out)}") if left_out else None
    return tuple(dict.fromkeys(choices)), note


def _cannot_run(method: str, spec, model_dir: str) -> str | None:
    if method == "suffix" and importlib.util.find_spec("arctic_inference") is None:
        return "needs the package arctic-inference: pip install arctic-inference"
    if method == "mtp" and not has_mtp_layers(model_dir):
        return "the model has no MTP layers (its config.json declares none); use ngram or a draft model"
    if method in _PATH_OF and not getattr(spec, _PATH_OF[method]):
        return f"give its path as speculation.{_PATH_OF[method]}"
    return None


def _configs(method: str, spec) -> list[dict]:
    out = []
    for k in spec.num_speculative_tokens:
        base = {"method": method, "num_speculative_tokens": k}
        if method in _PATH_OF:
            base["model"] = getattr(spec, _PATH_OF[method])
        windows = [{"prompt_lookup_max": hi, "prompt_lookup_min": lo} for lo, hi in spec.prompt_lookup] \
            if method == "ngram" else [{}]
        for window in windows:
            out.append({**base, **window})
            out += [{**base, **window, "num_speculative_tokens_per_batch_size": [[1, b, k], [b + 1, b + 1, 0]]}
                    for b in spec.per_batch_size]
    return out


def has_mtp_layers(model_dir: str) -> bool:
    """Whether the model's config.json declares multi-token-prediction layers (DeepSeek-V3, GLM-4.5,
    MiMo: num_nextn_predict_layers; Qwen3-Next: mtp_num_hidden_layers)."""
    try:
        config = json.loads((Path(model_dir).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return any(isinstance(config.get(k), int) and config[k] > 0
               for k in ("num_nextn_predict_layers", "mtp_num_hidden_layers"))
