"""Facts about the model that the search space and the workload need, read from its config.json.

`--model` is a local directory or a Hugging Face id. For an id, config.json comes from
the Hub (one small file, never the weights) or, when the Hub cannot be reached, from the
local Hugging Face cache. A model that cannot be found is a ConfigError raised at the door,
before anything is written.

The Hub is asked once, without huggingface_hub's retries (which sleep 1+2+4+8+8 s on a
machine with no network before giving up), with a short connect timeout; `HF_HUB_OFFLINE=1`
skips it and reads the cache only. `HF_ENDPOINT` and `HF_HOME`/`HF_HUB_CACHE` are honoured
as huggingface_hub reads them.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from optimizer.errors import ConfigError, first_line

_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1}
HUB_CONNECT_TIMEOUT_S = 5.0  # one TCP/TLS connect to the Hub; a reachable Hub answers in well under a second
HUB_READ_TIMEOUT_S = 10.0  # huggingface_hub's own default for this request (HF_HUB_ETAG_TIMEOUT)


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
    heads: int = 0  # attention heads (0: not read); tensor parallelism must divide them

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


def read_config(source: str) -> dict:
    """The config.json of a local model directory or a Hub id (the Hub, then its cache); ConfigError
    naming the problem and the fix when it cannot be read."""
    return _read_config(source)


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
    if path.exists():  # there, but not a directory: say what it is, not that it is missing
        if path.name == "config.json":
            raise ConfigError(f"model: {source} is a file; pass the model directory that holds it ({path.parent})")
        what = "a file" if path.is_file() else "not a directory"
        raise ConfigError(f"model: {source} is {what}; pass a model directory (the one holding config.json), "
                          "a Hugging Face id (org/name), or run `python -m optimizer tiny-model DIR` first")
    looks_local = source.startswith(("/", ".", "~"))
    if looks_local or not _HF_ID.match(source):
        raise ConfigError(
            f"model: directory {source} does not exist; pass an existing model directory, "
            "a Hugging Face id (org/name), or run `python -m optimizer tiny-model DIR` first"
        )
    return _read_hub_config(source)


def _read_hub_config(source: str) -> dict:
    """config.json of Hugging Face model `source`: one request to the Hub (no retry loop), then
    huggingface_hub's own download (and cache) once the Hub has answered; the local cache when
    the Hub cannot be reached or HF_HUB_OFFLINE is set. Every failure is one ConfigError line."""
    try:
        import huggingface_hub as hub
        from huggingface_hub import constants
    except ImportError as exc:
        raise ConfigError(f"model: {source} is not a local directory, and huggingface_hub is not installed to read "
                          "it from the Hub; pass a local model directory") from exc
    offline = bool(getattr(constants, "HF_HUB_OFFLINE", False))
    probe_error = None if offline else _probe_hub(hub, source)
    if not offline and probe_error is None:
        try:
            return _load_json(hub.hf_hub_download(source, "config.json"), source)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - it answered a moment ago: a failure now is one line too
            probe_error = exc
    cached = _cached_config(hub, source)
    if cached is not None:
        return _load_json(cached, source)
    fetch = (f"pass a local model directory: on a machine with access run `hf download {source} --local-dir DIR` "
             "and copy DIR here")
    if offline:
        raise ConfigError(f"model: {source} is not a local directory, and HF_HUB_OFFLINE is set but the Hugging Face "
                          f"cache ({constants.HF_HUB_CACHE}) does not hold it; {fetch} (or unset HF_HUB_OFFLINE "
                          "where the Hub can be reached)")
    kind = _kind(probe_error)
    if kind == "GatedRepoError":
        raise ConfigError(f"model: Hugging Face model {source} is gated; accept its terms on the Hub and log in "
                          "(`hf auth login`), or pass a local model directory") from probe_error
    if kind in ("RepositoryNotFoundError", "RevisionNotFoundError"):
        raise ConfigError(f"model: no Hugging Face model {source} (or it is private: log in with `hf auth login`); "
                          "check the id, or pass a local model directory") from probe_error
    if kind == "EntryNotFoundError":
        raise ConfigError(f"model: Hugging Face repo {source} has no config.json; is it a transformers model? "
                          "Pass another id or a local model directory") from probe_error
    status = getattr(getattr(probe_error, "response", None), "status_code", None)
    if kind == "HfHubHTTPError" and status is not None:
        later = "try again later" if status >= 500 or status in (408, 429) else "check the id and HF_ENDPOINT"
        raise ConfigError(f"model: the Hugging Face Hub ({constants.ENDPOINT}) answered HTTP {status} for config.json "
                          f"of {source}, and the Hugging Face cache does not hold it; {later}, or "
                          f"{fetch}") from probe_error
    raise ConfigError(f"model: {source} is not a local directory and not in the Hugging Face cache, and the Hub "
                      f"({constants.ENDPOINT}) cannot be reached ({type(probe_error).__name__}: "
                      f"{first_line(probe_error, 120)}); {fetch} (or copy its Hugging Face cache here and set "
                      "HF_HUB_OFFLINE=1)") from probe_error


def _probe_hub(hub, source: str) -> Exception | None:
    """None if the Hub answers for config.json of `source`, else the error: one HEAD request,
    no retries (get_hf_file_metadata retries only when asked), a short connect timeout."""
    head = hub.get_hf_file_metadata  # imports huggingface_hub's HTTP module (the package loads lazily)
    timeout: object = HUB_READ_TIMEOUT_S
    client = getattr(sys.modules.get("huggingface_hub.utils._http"), "httpx2", None)
    if client is not None:  # huggingface_hub >= 2 (httpx2): a connect timeout of its own
        timeout = client.Timeout(HUB_READ_TIMEOUT_S, connect=HUB_CONNECT_TIMEOUT_S)
    answers = [OSError, ValueError]  # what a request that did not get its answer raises; a bug still raises
    for owner, name in ((getattr(hub, "errors", None), "HfHubHTTPError"), (client, "HTTPError"),
                        (client, "TransportError"), (sys.modules.get("requests"), "RequestException")):
        if isinstance(getattr(owner, name, None), type):
            answers.append(getattr(owner, name))
    try:
        head(hub.hf_hub_url(source, "config.json"), timeout=timeout)
    except tuple(answers) as exc:  # classified by the caller; nothing here is retried
        return exc
    return None


def _cached_config(hub, source: str) -> str | None:
    """The path of config.json of `source` in the local Hugging Face cache, or None; never the network."""
    try:
        return hub.hf_hub_download(source, "config.json", local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached (or an unreadable cache): the caller says what to do
        return None


def _load_json(file: str, source: str) -> dict:
    try:
        data = json.loads(Path(file).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model: config.json of Hugging Face model {source} ({file}) is not readable JSON "
                          f"({type(exc).__name__}); delete it from the cache and try again") from None
    if not isinstance(data, dict):
        raise ConfigError(f"model: config.json of Hugging Face model {source} ({file}) is not a JSON object; "
                          "is it a transformers model?")
    return data


def _kind(exc: BaseException | None) -> str:
    """The most specific huggingface_hub error class `exc` is (by name: the module that defines them
    moved between huggingface_hub versions), or its own class name."""
    names = [k.__name__ for k in type(exc).__mro__]
    for name in ("GatedRepoError", "RepositoryNotFoundError", "RevisionNotFoundError", "EntryNotFoundError",
                 "HfHubHTTPError"):
        if name in names:
            return name
    return type(exc).__name__


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
            heads=heads,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"model: config.json of {source} lacks a usable {exc}; is it a decoder LLM?") from exc
    return info
