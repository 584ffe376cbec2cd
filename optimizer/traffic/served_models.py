"""What the watched vLLM servers admit: the `max_model_len` their OpenAI `/v1/models` page lists
for each model they serve (vLLM answers a longer request 400). Read once, when the daemon starts
watching `vllm_metrics` URLs: the same host and port as each `/metrics` URL, path `/v1/models`.
A server behind an API key answers 401 here; the daemon then falls back to what it is told."""

from __future__ import annotations

import json
from urllib.parse import urlsplit, urlunsplit

from optimizer.traffic.scrape import SourceError, http_get


def models_url(metrics_url: str) -> str:
    """`http://host:port/prefix/metrics` -> `http://host:port/prefix/v1/models`."""
    parts = urlsplit(metrics_url)
    path = parts.path[: -len("/metrics")] if parts.path.endswith("/metrics") else parts.path.rstrip("/")
    return urlunsplit((parts.scheme, parts.netloc, f"{path}/v1/models", "", ""))


def served_max_model_len(metrics_urls: list[str], timeout: float) -> tuple[int | None, list[str]]:
    """The smallest `max_model_len` over every model the servers list (None when none says), and
    one line for each server that did not say."""
    lengths, unread = [], []
    for url in metrics_urls:
        models = models_url(url)
        try:
            body = json.loads(http_get(models, timeout, "a vLLM server's OpenAI API"))
            found = [m["max_model_len"] for m in body.get("data", [])
                     if isinstance(m, dict) and isinstance(m.get("max_model_len"), int)]
        except (SourceError, ValueError, AttributeError) as exc:
            unread.append(str(exc) if isinstance(exc, SourceError) else f"{models} is not a model list ({exc})")
            continue
        if found:
            lengths.append(min(found))
        else:
            unread.append(f"{models} lists no max_model_len")
    return (min(lengths) if lengths else None), unread
