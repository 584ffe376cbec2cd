"""The daemon's live traffic: a `vllm_metrics` or `prometheus` source (traffic/), read every poll,
turned into traffic windows the `observed` workload replays.

A window is complete once the reads span `window_s` (at once with Prometheus, which keeps the
history); it is tuned on only with at least `min_requests` arrivals (finished plus the backlog's
growth: a server falling behind finishes few) and at least one finished request (the lengths
rest on those; the workload's notes say how many), else it is reported ("too little traffic") and skipped. A window whose backlog
grew is `saturated` (traffic/window.py): said once per episode on the console, in `/status`
(`watch.window.saturated`), in the status metrics, and through `on_saturated` (the webhook). A read that fails is reported in `/status` and
tried again at the next poll; the daemon keeps running. Each window tuned on is written to
`<artifacts_dir>/traffic/window-<end>.json`, the file the generation's workload names.
"""

from __future__ import annotations

import time
from pathlib import Path

from optimizer import shutdown
from optimizer.config.schema import LiveWatch
from optimizer.traffic import window as window_mod
from optimizer.traffic.prometheus import PrometheusSource
from optimizer.traffic.scrape import MetricsSource
from optimizer.traffic.window import Window

MIN_FINISHED = 1  # the lengths rest on the finished requests (an overloaded server finishes few: the notes say how many)


def make_source(live: LiveWatch):
    if live.prometheus:
        return PrometheusSource(live.prometheus, live.selector, live.window_s, live.window_s / live.sub_windows)
    return MetricsSource(live.vllm_metrics or [], live.window_s)


class Observer:
    def __init__(self, live: LiveWatch, poll_s: float, directory: Path, state, console, on_saturated=None):
        self.live, self.poll_s, self.directory = live, poll_s, Path(directory)
        self.state, self.console = state, console
        self.on_saturated = on_saturated  # called with the window when a saturated episode starts
        self.saturated = False
        self.beats = True  # its reports refresh the heartbeat (False while another thread reads: generation_watch)
        self.source = make_source(live)
        self.watch: dict = {"source": self.source.describe(), "last_check": None, "last_change": None}
        self.not_before = 0.0  # Prometheus: no window ending before this is used
        self._kind: str | None = None
        self._erred = False

    def check(self) -> None:
        """At start: every watched URL answers with vLLM series (ConfigError, exit 2, otherwise)."""
        self.source.check()

    def restart(self, wait_s: float = 0.0) -> None:
        """Forget the reads so far: the next window is the traffic from now on. With Prometheus,
        which always has a full window, `wait_s` holds the next window back that long."""
        if isinstance(self.source, MetricsSource):
            self.source.polls = []
            self.source.poll()
        else:
            self.not_before = time.time() + wait_s

    def current(self) -> Window | None:
        """Read the source once; the complete window with enough traffic, else None (and why, in /status)."""
        errors = self.source.poll()
        self.watch["last_check"] = time.time()
        for line in errors:
            self.console.print(f"[red]traffic source[/]: {line}")
        self._error("; ".join(errors) if errors else None)
        w = self.source.window()
        if w is not None and w.end < self.not_before:
            self._note("waiting", f"reading a whole window of the new traffic: {self.not_before - w.end:.0f} s to go")
            return None
        if w is None and isinstance(self.source, PrometheusSource):
            self._note("none", "no traffic in the window yet (no vllm:request_prompt_tokens series moved)")
            return None
        if w is None or self.source.spanned() < self.live.window_s - self.poll_s / 2:
            self._note("collecting", f"collecting a window: {self.source.spanned():.0f} of {self.live.window_s:.0f} s read")
            return None
        self._window(w)
        if w.arrivals < self.live.min_requests or w.requests < MIN_FINISHED:
            self._note("too little", f"too little traffic: {w.arrivals:.0f} requests arrived ({w.requests:.0f} "
                       f"finished) in the last {w.duration:.0f} s; {self.live.min_requests} arrivals "
                       "(daemon.watch.min_requests) and a finished request needed; skipped, not tuned on")
            return None
        self._note(None, None)
        return w

    def _window(self, w: Window) -> None:
        """The window in /status, and a saturated episode's start said once (console, callback)."""
        self.watch["window"] = {"start": w.start, "end": w.end, "requests": round(w.requests, 1),
                                "arrivals": round(w.arrivals, 1), "rate": round(w.rate, 3),
                                "saturated": w.saturated, "backlog_growth": round(w.backlog_growth, 1),
                                "prefix_hit_rate": w.prefix_hit_rate, "burstiness": w.burstiness,
                                "concurrency": w.concurrency, "prompt": window_mod.length_quantiles(w.prompt_lengths()[0]),
                                "output": window_mod.length_quantiles(w.output), "production": w.production()}
        if w.saturated and not self.saturated:
            self.console.print(f"  [bold red]saturated[/]: {w.arrivals:.0f} requests arrived in {w.duration:.0f} s, "
                               f"{w.requests:.0f} finished; the backlog grew by {w.backlog_growth:.0f}")
            if self.on_saturated is not None:
                self.on_saturated(w)
        self.saturated = w.saturated

    def _note(self, kind: str | None, text: str | None) -> None:
        """`watch.note` in /status always; the console only when the kind of note changes."""
        if text and kind != self._kind:
            self.console.print(f"  {text}")
        self._kind = kind
        self.watch["note"] = text
        self.state.put({"watch": self.watch}, beat=self.beats)

    def _error(self, text: str | None) -> None:
        """`last_error` for the source's own failures; clears only what it set itself."""
        if text or self._erred:
            self.state.put({"last_error": text}, beat=self.beats)
        self._erred = bool(text)

    def first(self) -> Path:
        """Read until a complete window holds enough traffic and its file is written; that file."""
        self.state.set(state="observing", running=None, watch=self.watch)
        self.console.print(f"observing {self.source.describe()} every {self.poll_s:g}s "
                           f"for a {self.live.window_s:g} s window")
        while (w := self.current()) is None or (path := self.save(w)) is None:
            shutdown.sleep(self.poll_s)
        return path

    def save(self, window: Window) -> Path | None:
        """The window's file; None (reported, tried again at the next poll) when it cannot be written."""
        path = self.directory / f"window-{int(window.end)}.json"
        try:
            return window_mod.write(window, path)
        except OSError as exc:
            why = f"{path}: cannot write the traffic window ({exc.strerror or exc}); free space in artifacts_dir"
            self.console.print(f"[red]not tuned on yet[/]: {why}")
            self._error(why)
            return None
