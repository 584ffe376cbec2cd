"""The `vllm_metrics` traffic source: the watched vLLM servers' own `/metrics` pages, read every
poll, the last `window_s` seconds of reads kept.

Reading a page is a plain HTTP GET of the URL given (nothing else is ever sent to a watched
server, but one GET of its `/v1/models` at start: traffic/served_models.py). A server that does not answer is reported and read again at the next poll; its
counters are compared with its last good read, so a missed poll loses nothing, and a restart
(counters back near zero) is a restart, not negative traffic (traffic/window.py). The one
loss: a server whose first read in a window failed counts from its first good read.
"""

from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.request

from optimizer.http_open import urlopen
from optimizer.errors import ConfigError
from optimizer.traffic.exposition import NotVllmMetrics, Reading, parse
from optimizer.traffic.window import Poll, Window, from_polls

TIMEOUT_S = 5.0
MAX_BYTES = 16 << 20  # a /metrics page is tens of kilobytes; a runaway page is not read whole


class SourceError(Exception):
    """A watched URL that did not answer, or answered with something else; one line, naming it."""


def http_get(url: str, timeout: float, what: str, named: str | None = None) -> bytes:
    """The body of a GET; SourceError naming the URL (or `named`) and what to check."""
    shown = named or url
    try:
        with urlopen(urllib.request.Request(url, headers={"Accept": "text/plain"}),
                                    timeout=timeout) as resp:
            return resp.read(MAX_BYTES)
    except urllib.error.HTTPError as exc:
        raise SourceError(f"{shown} answered HTTP {exc.code}; check that it is {what}") from exc
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        why = getattr(exc, "reason", None) or exc or type(exc).__name__
        raise SourceError(f"{shown} is unreachable ({why}); check the address and that {what} is up") from exc


def read(url: str, timeout: float = TIMEOUT_S) -> Reading:
    """One read of a vLLM /metrics page; SourceError when it fails or is not vLLM's."""
    body = http_get(url, timeout, "a vLLM server's /metrics")
    try:
        return parse(body.decode("utf-8", "replace"), time.time())
    except NotVllmMetrics as exc:
        raise SourceError(f"{url} answers but is not a vLLM server's metrics ({exc}); "
                          "point daemon.watch.vllm_metrics at http://<vllm host>:<port>/metrics") from exc


class MetricsSource:
    kind = "vllm_metrics"

    def __init__(self, urls: list[str], window_s: float, timeout_s: float = TIMEOUT_S):
        self.urls, self.window_s, self.timeout_s = list(urls), window_s, timeout_s
        self.polls: list[Poll] = []

    @property
    def source(self) -> dict:
        return {"kind": self.kind, "urls": self.urls}

    def describe(self) -> str:
        return f"vLLM /metrics of {', '.join(self.urls)}"

    def check(self) -> None:
        """Read every URL once (the first poll); ConfigError on the first that fails, at start."""
        reads = {}
        for url in self.urls:
            try:
                reads[url] = read(url, self.timeout_s)
            except SourceError as exc:
                raise ConfigError(f"daemon.watch: {exc}") from exc
        self.polls = [(time.time(), reads)]

    def poll(self) -> list[str]:
        """Read every URL; returns one line per URL that failed (the others are kept)."""
        reads, errors = {}, []
        for url in self.urls:
            try:
                reads[url] = read(url, self.timeout_s)
            except SourceError as exc:
                reads[url] = None
                errors.append(str(exc))
        now = time.time()
        self.polls.append((now, reads))
        # Keep the newest read at or before the window's start: it is the window's base.
        while len(self.polls) > 2 and self.polls[1][0] <= now - self.window_s:
            self.polls.pop(0)
        return errors

    def spanned(self) -> float:
        """Seconds the kept reads span (a window is complete at window_s)."""
        return self.polls[-1][0] - self.polls[0][0] if len(self.polls) > 1 else 0.0

    def window(self) -> Window | None:
        return from_polls(self.polls, self.source)
