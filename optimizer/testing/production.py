"""A stand-in production for tests and benches of the daemon's live sources: traffic of a chosen
shape sent to a real vLLM server by the project's own replayer, from a background thread, and a
real Prometheus server (Debian's package, scripts/prometheus_for_tests.sh) scraping it.
"""

from __future__ import annotations

import random
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from optimizer.http_open import urlopen
from optimizer.engine.vllm import free_port
from optimizer.measure.replay import run_replay
from optimizer.workload.arrivals import rate_schedule
from optimizer.workload.base import Request
from optimizer.workload.tokens import Vocabulary


@dataclass(frozen=True)
class TrafficShape:
    prompt: tuple[int, int]  # prompt tokens, drawn uniformly
    output: tuple[int, int]  # output tokens (sent with ignore_eos)
    rate: float  # requests/s, Poisson arrivals
    shared_prefix: int = 0  # tokens every prompt starts with (a system prompt), cached after the first


class Traffic:
    """Sends `shape` to `base_url` in batches of `batch_s` seconds until `stop()`; `shape` may be
    switched while it runs (the next batch has the new shape). `sent` holds every request sent."""

    def __init__(self, base_url: str, model: str, vocab: Vocabulary, shape: TrafficShape, seed: int = 0,
                 batch_s: float = 5.0):
        self.base_url, self.model, self.vocab, self.shape = base_url, model, vocab, shape
        self.rng, self.batch_s = random.Random(seed), batch_s
        self.sent: list[tuple[float, TrafficShape, Request]] = []
        self.paused = threading.Event()
        self._stop = threading.Event()
        self._batches: list[threading.Thread] = []
        self._thread = threading.Thread(target=self._run, name="production-traffic", daemon=True)

    def start(self) -> "Traffic":
        self._thread.start()
        return self

    def _batch(self, shape: TrafficShape) -> tuple[Request, ...]:
        n = max(1, round(shape.rate * self.batch_s))
        offs = rate_schedule(n, shape.rate, 1.0, self.rng)
        prefix = self.vocab.block("production-system-prompt", shape.shared_prefix)
        out = []
        for i in range(n):
            length = self.rng.randint(*shape.prompt)
            ids = prefix[:min(shape.shared_prefix, length - 1)]
            out.append(Request(f"prod-{len(self.sent) + i}", ids + self.vocab.random_ids(self.rng, length - len(ids)),
                               self.rng.randint(*shape.output), offs[i]))
        return tuple(out)

    def _run(self) -> None:
        """A batch every `batch_s`, each replayed by its own thread: arrivals stay open-loop when
        the server falls behind (a batch does not wait for the one before it to finish)."""
        next_at = time.monotonic()
        while not self._stop.is_set():
            if self.paused.is_set():
                time.sleep(0.2)
                next_at = time.monotonic()
                continue
            shape = self.shape
            batch = self._batch(shape)
            now = time.time()
            self.sent.extend((now + r.offset_s, shape, r) for r in batch)
            t = threading.Thread(target=run_replay, args=(self.base_url, self.model, batch, None), daemon=True,
                                 kwargs={"request_timeout": 120.0,
                                         "stop_when": lambda finished: "stopped" if self._stop.is_set() else ""})
            t.start()
            self._batches.append(t)
            next_at += self.batch_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self, wait_s: float = 60.0) -> None:
        """Stop sending; wait up to `wait_s` in all for the batches in flight (a server falling
        behind may hold requests for minutes: they end when the server stops)."""
        self._stop.set()
        self._thread.join(timeout=30)
        deadline = time.monotonic() + wait_s
        for t in self._batches:
            t.join(timeout=max(0.0, deadline - time.monotonic()))


class Prometheus:
    """A real Prometheus on a loopback port scraping `targets` (host:port) every `scrape_s`."""

    def __init__(self, binary: str, directory: Path, targets: list[str], scrape_s: float = 1.0):
        self.binary, self.directory = binary, Path(directory)
        self.targets, self.scrape_s = targets, scrape_s
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> "Prometheus":
        self.directory.mkdir(parents=True, exist_ok=True)
        cfg = self.directory / "prometheus.yml"
        targets = ", ".join(f"'{t}'" for t in self.targets)
        cfg.write_text(f"global:\n  scrape_interval: {self.scrape_s:g}s\n  evaluation_interval: {self.scrape_s:g}s\n"
                       f"scrape_configs:\n  - job_name: vllm\n    static_configs:\n      - targets: [{targets}]\n")
        log = (self.directory / "prometheus.log").open("w")
        self.proc = subprocess.Popen([self.binary, f"--config.file={cfg}", f"--storage.tsdb.path={self.directory / 'data'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}"], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                time.sleep(0.3)
            if self.proc.poll() is not None:
                break
        raise RuntimeError(f"Prometheus did not become ready: {(self.directory / 'prometheus.log').read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
