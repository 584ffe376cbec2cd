"""The daemon's watch over live traffic (daemon/observing.py, Daemon._watch_live): what it tunes on
and when. The source is a scripted stand-in that hands out windows (the HTTP sources themselves
are tested in tests/unit/traffic and, against real servers, in tests/integration)."""

import io
import math
import time

from rich.console import Console

from optimizer.config.schema import build_config
from optimizer.daemon.generations import with_source
from optimizer.daemon.loop import Daemon
from optimizer.traffic import window as window_mod
from optimizer.traffic.histogram import Histogram
from optimizer.traffic.window import Window
from optimizer.workload import drift

BOUNDS = (100.0, 200.0, 500.0, 1000.0, 2000.0, math.inf)


def window(prompt_bucket: int, requests: float = 40.0, span: float = 1.0) -> Window:
    counts = [0.0] * len(BOUNDS)
    for i in range(prompt_bucket, len(BOUNDS)):
        counts[i] = requests
    now = time.time()
    h = Histogram(BOUNDS, tuple(counts), requests * BOUNDS[prompt_bucket] * 0.8)
    return Window({"kind": "prometheus", "url": "http://p", "selector": ""}, now - span, now, requests, h,
                  Histogram(BOUNDS, (requests,) * len(BOUNDS), requests * 50))


class Scripted:
    """A source handing out `script`'s windows in turn (a function of the poll), always complete."""

    kind = "prometheus"

    def __init__(self, script):
        self.script, self.polls = script, 0
        self.current = None

    def describe(self):
        return "Prometheus http://p (all series)"

    def poll(self):
        self.current = self.script(self.polls)
        self.polls += 1
        return []

    def spanned(self):
        return 1e9

    def window(self):
        return self.current


def daemon(tmp_path, script, min_requests=25, slos=None, breach_s=300):
    cfg = build_config({"model": {"path": "/m"}, "artifacts_dir": str(tmp_path), "daemon": {
        "watch": {"prometheus": "http://p", "window_s": 10, "min_requests": min_requests}, "poll_s": 1,
        "threshold": 0.25, "slo_breach_s": breach_s}, **({"objective": {"slos": slos}} if slos else {})})
    out = io.StringIO()
    d = Daemon(cfg, Console(file=out, width=300), "127.0.0.1", 0, None)
    d.d = d.d.model_copy(update={"poll_s": 0.01})  # the scripted source answers at once: no need to wait 1 s
    d.observer.poll_s = 0.01
    d.observer.source = Scripted(script)
    short = d.live.model_copy(update={"window_s": 1.0})  # the schema asks for 10 s or more; a test has less time
    d.live = d.observer.live = short
    return d, out


def test_a_change_is_tuned_on_once_a_whole_window_of_it_was_read(tmp_path):
    d, out = daemon(tmp_path, lambda n: window(1) if n < 3 else window(4))
    t = time.time()
    trigger, path = d._watch_live(drift.shape_of_window(window(1)), time.time(), None)
    assert time.time() - t >= 1  # the window (1 s) of the new traffic was read before tuning
    assert trigger.startswith("traffic changed on Prometheus http://p (all series): input p10")
    saved = window_mod.read(path)
    assert saved.prompt.quantile(0.5) > 1000 and saved.start >= t
    text = out.getvalue()
    assert "reading a whole window of it (1 s) before tuning" in text
    assert text.count("reading a whole window of the new traffic") == 1  # said once, not every poll


def test_a_change_that_does_not_last_is_not_tuned_on(tmp_path):
    d, out = daemon(tmp_path, lambda n: window(4) if n == 2 else window(1))
    d.d = d.d.model_copy(update={"retune_every_h": 2 / 3600})  # give up after 2 s: no re-tune came first
    trigger, _ = d._watch_live(drift.shape_of_window(window(1)), time.time(), None)
    assert trigger.startswith("scheduled re-tune")
    assert "the change did not last" in out.getvalue()


def test_too_little_traffic_is_reported_and_never_compared(tmp_path):
    d, out = daemon(tmp_path, lambda n: window(4, requests=10) if n < 5 else window(1))
    d.d = d.d.model_copy(update={"retune_every_h": 0.5 / 3600})
    trigger, _ = d._watch_live(drift.shape_of_window(window(1)), time.time(), None)
    assert trigger.startswith("scheduled re-tune")  # the thin, different window started nothing
    text = out.getvalue()
    assert text.count("too little traffic: 10 requests arrived (10 finished) in the last 1 s; 25 arrivals "
                      "(daemon.watch.min_requests) needed; skipped, not tuned on") == 1
    assert d.state.snapshot()["watch"]["window"]["requests"] == 40.0


def test_an_overloaded_window_counts_its_backlog_is_tuned_on_and_said_saturated_once(tmp_path):
    """24 requests finished (below min_requests 25) while the backlog grew by 30: 54 arrived. The
    window is tuned on, at the arrival rate, and the saturation is said once, with the callback."""
    from dataclasses import replace
    said = []
    d, out = daemon(tmp_path, lambda n: replace(window(4, requests=24), backlog_growth=30.0))
    d.observer.on_saturated = said.append
    d.d = d.d.model_copy(update={"retune_every_h": 1.5 / 3600})
    trigger, path = d._watch_live(drift.shape_of_window(window(1)), time.time(), None)
    assert trigger.startswith("traffic changed") and "rate 40.00 -> 54.00 req/s" in trigger
    saved = window_mod.read(path)
    assert saved.saturated and saved.arrivals == 54.0 and saved.rate == 54.0
    text = out.getvalue()
    assert text.count("saturated: 54 requests arrived in 1 s, 24 finished; the backlog grew by 30") == 1
    assert len(said) == 1 and said[0].saturated
    shown = d.state.snapshot()["watch"]["window"]
    assert shown["saturated"] is True and shown["arrivals"] == 54.0 and shown["requests"] == 24.0


def test_a_live_watch_replays_the_window_as_the_observed_scenario(tmp_path):
    cfg = build_config({"model": {"path": "/m"}, "workload": {"seed": 3, "warmup_requests": 1},
                        "daemon": {"watch": {"vllm_metrics": ["http://a:8000/metrics"], "requests": 50}}})
    spec = with_source(cfg, tmp_path / "window-1.json").workload
    assert (spec.scenario, spec.path, spec.requests, spec.seed, spec.warmup_requests) == (
        "observed", str(tmp_path / "window-1.json"), 50, 3, 1)


def test_a_window_that_cannot_be_written_is_reported_and_tried_again(tmp_path):
    d, out = daemon(tmp_path, lambda n: window(1))
    (tmp_path / "traffic").write_text("a file where the directory should be")
    assert d.observer.save(window(1)) is None
    assert "cannot write the traffic window" in d.state.snapshot()["last_error"]
    assert "not tuned on yet" in out.getvalue()


def test_under_a_live_watch_the_workload_may_be_left_out_or_observed_and_which_requests_wins_is_fixed(tmp_path):
    from optimizer.daemon.observing import observed_spec
    live = {"vllm_metrics": ["http://a:8000/metrics"], "requests": 50}
    bare = build_config({"model": {"path": "/m"}, "daemon": {"watch": live}})
    observed = build_config({"model": {"path": "/m"}, "workload": {"scenario": "observed", "seed": 4},
                             "daemon": {"watch": live}})
    written = build_config({"model": {"path": "/m"}, "workload": {"scenario": "observed", "requests": 80},
                            "daemon": {"watch": live}})
    assert observed.workload.path is None  # no path needed: the daemon fills it in
    assert observed_spec(bare, bare.daemon.watch, tmp_path / "w.json").requests == 50
    assert observed_spec(observed, observed.daemon.watch, tmp_path / "w.json").requests == 50
    assert observed_spec(observed, observed.daemon.watch, tmp_path / "w.json").seed == 4
    assert observed_spec(written, written.daemon.watch, tmp_path / "w.json").requests == 80
    out = io.StringIO()
    d = Daemon(observed.model_copy(update={"artifacts_dir": str(tmp_path)}), Console(file=out), "127.0.0.1", 0, None)
    assert d._checkable(None).workload.scenario == "chat" and out.getvalue() == ""


def test_an_observed_workload_without_a_window_outside_the_daemon_names_the_fix():
    import pytest
    from optimizer.config.workload_spec import ObservedSpec
    from optimizer.errors import ConfigError
    from optimizer.workload.observed import observed_workload
    from optimizer.workload.tokens import Vocabulary
    with pytest.raises(ConfigError, match="workload.path: an observed workload replays a traffic window file"):
        observed_workload(ObservedSpec(), Vocabulary(1000, "/m", 2048))


def test_the_whole_live_configs_in_the_daemon_docs_are_valid_configs():
    import re
    from pathlib import Path

    import yaml
    docs = (Path(__file__).parents[3] / "docs" / "daemon.md").read_text()
    section = docs[docs.index("## A whole config for live servers"):docs.index("## Running beside a fleet")]
    whole, prometheus = re.findall(r"```yaml\n(.*?)```", section, re.S)
    cfg = build_config(yaml.safe_load(whole))
    assert cfg.daemon.watch.vllm_metrics and cfg.daemon.on_change == "auto"
    swapped = yaml.safe_load(whole)
    swapped["daemon"]["watch"] = yaml.safe_load("daemon:\n" + prometheus)["daemon"]["watch"]
    assert build_config(swapped).daemon.watch.prometheus == "http://prometheus:9090"


def test_a_full_queue_with_few_arrivals_is_tuned_on_as_saturated_not_skipped_as_too_little(tmp_path):
    """13 requests arrived and 14 finished in the window (min_requests 25) while requests waited at every
    read: a queue that stays full. The window is tuned on, and said saturated once, naming why."""
    from dataclasses import replace
    said = []
    d, out = daemon(tmp_path, lambda n: replace(window(4, requests=14), backlog_growth=-1.0, waiting_share=1.0))
    d.observer.on_saturated = said.append
    d.d = d.d.model_copy(update={"retune_every_h": 1.5 / 3600})
    trigger, path = d._watch_live(drift.shape_of_window(window(1)), time.time(), None)
    assert trigger.startswith("traffic changed") and window_mod.read(path).saturated
    text = out.getvalue()
    assert "too little traffic" not in text
    assert text.count("saturated: 13 requests arrived in 1 s, 14 finished; requests waited in 100% of the reads") == 1
    assert len(said) == 1
    shown = d.state.snapshot()["watch"]["window"]
    assert shown["saturated"] is True and shown["saturation"] == ["requests waited in 100% of the reads"]


def test_rejected_requests_are_traffic_said_once_as_an_episode_and_never_too_little(tmp_path):
    """Every prompt past --max-model-len answered 400: nothing finished, 40 rejected. The daemon says so
    (not "too little traffic"), once, with the callback, and /status counts them."""
    from dataclasses import replace
    rejecting = []

    def script(n):
        w = window(4, requests=30)
        return replace(w, requests=0.0, prompt=Histogram(BOUNDS, (0.0,) * len(BOUNDS), 0.0), rejected_4xx=40.0) \
            if n < 3 else replace(w, rejected_4xx=2.0)

    d, out = daemon(tmp_path, script)
    d.observer.on_rejecting = rejecting.append
    for _ in range(5):
        d.observer.current()
    text = out.getvalue()
    assert text.count("rejecting: 40 of 40 requests sent in 1 s were answered 4xx (40) or 5xx (0)") == 1
    assert text.count("no request finished in the last 1 s (0 arrived, 40 rejected): no lengths to tune on") == 1
    assert "too little traffic" not in text and len(rejecting) == 1
    shown = d.state.snapshot()["watch"]["window"]
    assert shown["rejected_4xx"] == 2.0 and shown["rejecting"] is False  # 2 of 32: not an episode
    from prometheus_client.parser import text_string_to_metric_families

    from optimizer.daemon.metrics_page import prometheus_text
    page = text_string_to_metric_families(prometheus_text(d.state.snapshot()))
    samples = {(s.name, s.labels.get("status")): s.value for f in page for s in f.samples}
    assert samples[("vllm_optimizer_traffic_rejected_requests", "4xx")] == 2.0
    sent = []
    d.publisher.event = sent.append  # the webhook hears of an episode as of a saturation
    d._rejecting(script(0))
    assert sent[0]["event"] == "rejecting" and sent[0]["window"]["rejected_4xx"] == 40.0


def test_a_plan_refused_on_new_traffic_is_said_once_per_reason_and_the_watch_goes_on(tmp_path, monkeypatch):
    """Every window of the new traffic fails the plan the same way (for 3 windows), then another way, then
    a plan is made: the console says each reason once; /status' last_error holds the latest."""
    from optimizer.errors import ConfigError

    d, out = daemon(tmp_path, lambda n: window(1))
    reasons = iter(["baseline.max-model-len: 8192 must lie between the workload's longest request (9973) and ..."] * 3
                   + ["the database is briefly down"])
    sources = iter(tmp_path / f"window-{i}.json" for i in range(10))
    d._watch = lambda study, plan, source: ("traffic changed", next(sources))

    def plan(n, source, warm, previous):
        reason = next(reasons, None)
        if reason:
            raise ConfigError(reason)
        return "the plan", []

    d._plan = plan
    monkeypatch.setattr("optimizer.daemon.loop.warm_starts", lambda study, how: [])  # no study here to start from
    trigger, source, _, made, _ = d._next_plan(None, None, None, 1)
    assert made == "the plan" and source == tmp_path / "window-4.json"
    text = out.getvalue()
    assert text.count("not re-tuning") == 2 and text.count("must lie between the workload's longest") == 1
    assert d.state.snapshot()["last_error"] == "the database is briefly down"


def test_a_lasting_slo_breach_starts_a_generation_once_and_is_said_as_it_begins_and_ends(tmp_path):
    """The same traffic throughout, but production's TPOT: 40% of requests within 50 ms at first
    (p95 needs 95%), then all of them. The breach is said, shown in /status and the metrics, and
    once it has lasted slo_breach_s it starts a generation; once only, however long it lasts."""
    from dataclasses import replace

    slow = Histogram((0.025, 0.05, 0.1, math.inf), (10.0, 16.0, 40.0, 40.0), 3.0)
    fast = Histogram((0.025, 0.05, 0.1, math.inf), (40.0, 40.0, 40.0, 40.0), 0.5)

    def script(n):
        return replace(window(1), latencies={"tpot": slow if n < 40 else fast}, concurrency=63.0)

    d, out = daemon(tmp_path, script, slos="tpot:50", breach_s=0.05)
    trigger, path = d._watch_live(drift.shape_of_window(window(1)), time.time(), None)
    assert trigger.startswith("SLO breach for ") and trigger.endswith(
        "production: 40% of requests meet TPOT <= 50 ms (p95 needs 95%); 63 requests in flight on average")
    assert window_mod.read(path).requests == 40.0
    shown = d.state.snapshot()["watch"]["window"]["slos"]["tpot_p95"]
    assert shown == {"limit_ms": 50.0, "percentile": 95, "share": 0.4, "met": False, "observations": 40.0}
    from prometheus_client.parser import text_string_to_metric_families

    from optimizer.daemon.metrics_page import prometheus_text
    page = text_string_to_metric_families(prometheus_text(d.state.snapshot()))
    assert {s.labels.get("slo"): s.value for f in page for s in f.samples
            if s.name == "vllm_optimizer_production_slo_attainment"} == {"tpot_p95": 0.4}
    assert d.observer.breach_due(d.d.slo_breach_s, time.time() + 60) is not None  # until a generation starts
    d.observer.tuning()  # the daemon's loop, as any generation starts: a breach open now is tuned on
    for n in range(50):  # the breach goes on (windows with no latency observed change nothing), then ends
        d.observer.source.script = (lambda k: replace(window(1), latencies={})) if 3 <= n < 6 else script
        d.observer.current()
        assert d.observer.breach_due(d.d.slo_breach_s, time.time() + 60) is None
        if n == 5:
            assert d.observer.breach is not None and "meets its SLOs again" not in out.getvalue()
    text = out.getvalue()
    assert text.count("SLO breach: production: 40% of requests meet TPOT") == 1
    assert text.count("production meets its SLOs again") == 1


def test_rejections_while_the_served_requests_press_against_max_model_len_are_named_as_such(tmp_path):
    """Production admits 8,192 tokens; the requests it served reach about 7,000 of them, and 40 were
    answered 4xx: likely prompts past --max-model-len, and the line says so. Short served requests
    with the same rejections say nothing of the kind."""
    from dataclasses import replace

    bounds = (1000.0, 2000.0, 5000.0, 10000.0, math.inf)

    def long_prompts(n):
        h = Histogram(bounds, (0.0, 0.0, 2.0, 40.0, 40.0), 40 * 6800.0)
        return replace(window(1), prompt=h, rejected_4xx=40.0)

    d, out = daemon(tmp_path, long_prompts)
    d.observer.admits = 8192
    d.observer.current()
    assert "likely prompts past its --max-model-len" in out.getvalue()
    assert d.state.snapshot()["watch"]["window"]["rejected_past_max_model_len"] is True
    d, out = daemon(tmp_path, lambda n: replace(window(1), rejected_4xx=40.0))
    d.observer.admits = 8192
    d.observer.current()
    assert "rejecting: " in out.getvalue() and "max-model-len" not in out.getvalue()
