"""The daemon's live traffic: a `vllm_metrics` or `prometheus` source (traffic/), read every poll,
turned into traffic windows the `observed` workload replays.

A window is complete once the reads span `window_s` (at once with Prometheus, which keeps the
history). It is judged against the study's TTFT SLO (`ttft_slo_s`). It is tuned on with at least
one finished request (the lengths rest on those; the workload's notes say how many) and either
`min_requests` arrivals (finished plus the backlog's growth: a server falling behind finishes
few) or saturation: a saturated window is never "too little traffic". Otherwise it is reported
and skipped. Two episodes are said once each as they begin, on the console, in `/status`
(`watch.window`) and the status metrics, and through a callback (the webhook):
- saturated (traffic/window.py: the backlog grew, requests waited through most of the window, or
  the median TTFT or queue time is past the SLO), naming which held: `on_saturated`;
- rejecting: at least REJECTING_MIN requests, and REJECTING_SHARE of those sent, answered 4xx or
  5xx: `on_rejecting`. When the served requests press against what production admits (their
  prompt p90 plus output p50 at PRESSING of its max-model-len, `admits`), the rejections are
  likely prompts past it, and the line says so;
- breaching: a study SLO that production's own histograms say it misses
  (traffic/slo_attainment.py); `breach_since` holds when the episode began, which the daemon's
  `slo_breach_s` turns into a trigger.
A read that fails is reported in `/status` and tried again at the next poll; the daemon keeps
running. Each window tuned on is written to `<artifacts_dir>/traffic/window-<end>.json`, the file
the generation's workload names.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from optimizer import shutdown
from optimizer.config.daemon_spec import LiveWatch
from optimizer.config.flags import pinned_model_len
from optimizer.config.schema import StudyConfig
from optimizer.config.workload_spec import ObservedSpec
from optimizer.traffic import lengths
from optimizer.traffic import window as window_mod
from optimizer.traffic.prometheus import PrometheusSource
from optimizer.traffic.slo_attainment import attainment
from optimizer.traffic.scrape import MetricsSource
from optimizer.traffic.served_models import served_max_model_len
from optimizer.traffic.window import Window

MIN_FINISHED = 1  # the lengths rest on the finished requests (an overloaded server finishes few: the notes say how many)
REJECTING_MIN = 5  # requests answered 4xx/5xx in a window before it is an episode (one bad client request is not)
REJECTING_SHARE = 0.05  # of the requests sent
PRESSING = 0.8  # of max-model-len: served requests this long suggest the rejected ones were longer


def make_source(live: LiveWatch):
    if live.prometheus:
        return PrometheusSource(live.prometheus, live.selector, live.window_s, live.window_s / live.sub_windows)
    return MetricsSource(live.vllm_metrics or [], live.window_s)


class Observer:
    def __init__(self, live: LiveWatch, poll_s: float, directory: Path, state, console, on_saturated=None,
                 slos: tuple = (), on_rejecting=None, admits: int | None = None):
        self.live, self.poll_s, self.directory = live, poll_s, Path(directory)
        self.state, self.console = state, console
        self.on_saturated = on_saturated  # called with the window when a saturated episode starts
        self.on_rejecting = on_rejecting  # called with the window when a rejecting episode starts
        self.slos = tuple(slos)
        self.admits = admits  # the longest request production admits (its max-model-len), when known
        ttft = [s.limit for s in self.slos if s.metric == "ttft"]
        self.ttft_slo_s = min(ttft) / 1000 if ttft else None  # the tightest TTFT limit, at any percentile
        self.saturated = self.rejecting = False
        self.breach: str | None = None  # what production misses now, one line; None when it meets every SLO
        self.breach_since: float | None = None
        self.breach_tuned = False  # this breach episode already started a generation
        self.beats = True  # its reports refresh the heartbeat (False while another thread reads: generation_watch)
        self.source = make_source(live)
        self.watch: dict = {"source": self.source.describe(), "last_check": None, "last_change": None}
        self.not_before = 0.0  # Prometheus: no window ending before this is used
        self._kind: str | None = None
        self._erred = False

    def check(self) -> None:
        """At start: every watched URL answers with vLLM series (ConfigError, exit 2, otherwise).
        Unless `daemon.watch.max_model_len` says it, what production admits is read from the
        watched servers' `/v1/models` (the baseline's max-model-len when they do not say)."""
        self.source.check()
        if self.live.max_model_len is None and isinstance(self.source, MetricsSource):
            served, unread = served_max_model_len(self.source.urls, self.source.timeout_s)
            for line in unread:
                self.console.print(f"  production's max-model-len not read: {line}")
            if served is not None:
                self.admits = served
                self.console.print(f"production admits {served:,} tokens a request (max_model_len on /v1/models)")
        self.watch["admits"] = self.admits
        self.state.put({"watch": self.watch}, beat=self.beats)

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
        if w is not None:
            w = replace(w, ttft_slo_s=self.ttft_slo_s)
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
        if w.requests < MIN_FINISHED:
            self._note("none finished", f"no request finished in the last {w.duration:.0f} s "
                       f"({w.arrivals:.0f} arrived, {w.rejected:.0f} rejected"
                       + (f"; saturated: {'; '.join(w.saturation())}" if w.saturated else "")
                       + "): no lengths to tune on; skipped")
            return None
        if w.arrivals < self.live.min_requests and not w.saturated:
            self._note("too little", f"too little traffic: {w.arrivals:.0f} requests arrived ({w.requests:.0f} "
                       f"finished) in the last {w.duration:.0f} s; {self.live.min_requests} arrivals "
                       "(daemon.watch.min_requests) needed; skipped, not tuned on")
            return None
        self._note(None, None)
        return w

    def _window(self, w: Window) -> None:
        """The window in /status, and a saturated episode's start said once (console, callback)."""
        attained = attainment(w.latencies, self.slos)
        self.watch["window"] = {"start": w.start, "end": w.end, "requests": round(w.requests, 1),
                                "arrivals": round(w.arrivals, 1), "rate": round(w.rate, 3),
                                "saturated": w.saturated, "saturation": w.saturation(),
                                "backlog_growth": round(w.backlog_growth, 1),
                                "waiting_share": None if w.waiting_share is None else round(w.waiting_share, 3),
                                "rejected_4xx": round(w.rejected_4xx, 1), "rejected_5xx": round(w.rejected_5xx, 1),
                                "rejecting": self._rejecting(w), "rejected_past_max_model_len": rejected_past(w, self.admits),
                                "slos": {a.slo.key: a.as_dict() for a in attained},
                                "prefix_hit_rate": w.prefix_hit_rate, "burstiness": w.burstiness,
                                "concurrency": w.concurrency, "prompt": window_mod.length_quantiles(w.prompt_lengths()[0]),
                                "output": window_mod.length_quantiles(w.output), "production": w.production()}
        if w.saturated and not self.saturated:
            self.console.print(f"  [bold red]saturated[/]: {w.arrivals:.0f} requests arrived in {w.duration:.0f} s, "
                               f"{w.requests:.0f} finished; {'; '.join(w.saturation())}")
            if self.on_saturated is not None:
                self.on_saturated(w)
        self.saturated = w.saturated
        rejecting = self._rejecting(w)
        if rejecting and not self.rejecting:
            past = (f"; the served requests reach {served_length(w):,.0f} of the {self.admits:,} tokens production "
                    "admits: likely prompts past its --max-model-len" if rejected_past(w, self.admits) else "")
            self.console.print(f"  [bold red]rejecting[/]: {w.rejected:.0f} of {w.arrivals + w.rejected:.0f} requests "
                               f"sent in {w.duration:.0f} s were answered 4xx ({w.rejected_4xx:.0f}) or 5xx "
                               f"({w.rejected_5xx:.0f}){past}")
            if self.on_rejecting is not None:
                self.on_rejecting(w)
        self.rejecting = rejecting

        self._breaching(w, attained)

    def _breaching(self, w: Window, found: list) -> None:
        """Production's SLO attainment (`found`): a breach episode said as it begins and ends, `breach_since` kept."""
        if not found:  # no latency observed in the window (idle, a scrape gap): the episode neither ends nor grows
            return
        missed = [a for a in found if not a.met]
        if not missed:
            if self.breach is not None:
                self.console.print("  production meets its SLOs again")
            self.breach = self.breach_since = None
            self.breach_tuned = False
            return
        flight = f"; {w.concurrency:.0f} requests in flight on average" if w.concurrency is not None else ""
        self.breach = "production: " + "; ".join(a.describe() for a in missed) + flight
        if self.breach_since is None:
            self.breach_since = w.end
            self.console.print(f"  [bold red]SLO breach[/]: {self.breach}")

    def breach_due(self, after_s: float, now: float) -> str | None:
        """The trigger when a breach has lasted `after_s` and no generation started since it began; else None."""
        if not after_s or self.breach is None or self.breach_tuned or now - self.breach_since < after_s:
            return None
        return f"SLO breach for {now - self.breach_since:.0f} s: {self.breach}"

    def tuning(self) -> None:
        """A generation starts (on whatever trigger): a breach open now has been tuned on."""
        self.breach_tuned = self.breach is not None

    @staticmethod
    def _rejecting(w: Window) -> bool:
        return w.rejected >= REJECTING_MIN and w.rejected_share >= REJECTING_SHARE

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


def served_length(w: Window) -> float:
    """The served requests' prompt p90 plus output p50, in tokens (0 without any)."""
    prompt, output = lengths.quantile(w.prompt_lengths()[0], 0.9), lengths.quantile(w.output, 0.5)
    return (prompt.value if prompt else 0.0) + (output.value if output else 0.0)


def rejected_past(w: Window, admits: int | None) -> bool:
    """Requests answered 4xx while the served ones press against what production admits (`admits`):
    likely prompts past its --max-model-len."""
    return bool(admits) and w.rejected_4xx > 0 and served_length(w) >= PRESSING * admits


def episode(name: str, study: str, generation: int, source: str | None, window: Window, **extra) -> dict:
    """The webhook body of a traffic episode (saturated, rejecting) of `study`'s generation, on `source`."""
    return {"event": name, "study": study, "generation": generation, "source": source,
            "window": {"start": window.start, "end": window.end, "arrivals": round(window.arrivals, 1),
                       "finished": round(window.requests, 1), "backlog_growth": round(window.backlog_growth, 1),
                       "rate": round(window.rate, 4), **extra}}


def observed_spec(cfg: StudyConfig, live: LiveWatch, source: Path, admits: int | None = None) -> ObservedSpec:
    """The workload replaying a live window: `workload.requests` when the config writes it under
    `scenario: observed`, else `daemon.watch.requests`; the workload's seed and warm-up either way.
    Its lengths are cut to what production admits (`admits`, the servers' own, Observer.check; else
    `admitted`), and to a --max-model-len engine.extra_args pins for every trial where shorter: such
    a trial server would cut a longer request's output (its counters then disagree with the
    workload: replay_invalid) or refuse it. A baseline's is not a bound: the admission raises it."""
    written = cfg.workload.scenario == "observed" and "requests" in cfg.workload.model_fields_set
    limits = [n for n in (admits or admitted(cfg, live), pinned_model_len(cfg.engine.extra_args)) if n]
    return ObservedSpec(path=str(source), requests=cfg.workload.requests if written else live.requests,
                        seed=cfg.workload.seed, warmup_requests=cfg.workload.warmup_requests,
                        max_model_len=min(limits) if limits else None)


def admitted(cfg: StudyConfig, live: LiveWatch) -> int | None:
    """The longest request production admits: `daemon.watch.max_model_len`, else the baseline's. (A
    pinned trial flag is not production's: it bounds the observed lengths in `observed_spec` only.)"""
    admits = live.max_model_len or (cfg.baseline or {}).get("max-model-len")
    return int(admits) if admits else None
