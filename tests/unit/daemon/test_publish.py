"""daemon/publish.py: the gate, the atomic `vllm serve --config` file, and the webhook (a real
local HTTP receiver)."""

import http.server
import json
import os
import re
from pathlib import Path
import threading
import time

import pytest
from dataclasses import astuple
import yaml

from optimizer.config.schema import build_config
from optimizer.daemon import publish
from tests.unit.driver.test_minimal import finished_study
from tests.unit.report.test_recommendation import with_minimal


def cfg(**daemon):
    return build_config({"model": {"path": "/m"}, "daemon": {"publish": daemon}})


def test_a_confirmed_gain_beyond_noise_is_published():
    ok, code, why = astuple(publish.decide(finished_study(), cfg()))
    assert ok and code == "published" and why.endswith("over the current configuration") and "95% CI" in why


def test_a_gain_below_min_gain_is_recorded_not_published():
    ok, code, why = astuple(publish.decide(finished_study(), cfg(min_gain=20.0)))
    assert not ok and code == "below_min_gain" and "below daemon.publish.min_gain (2000%)" in why


def test_single_runs_are_never_published():
    study = finished_study()
    study.set_user_attr("confirmation", {})
    ok, code, why = astuple(publish.decide(study, cfg()))
    assert not ok and code == "single_runs" and "the confirmation did not run" in why


def test_a_gain_within_noise_is_not_published():
    study = finished_study()
    conf = dict(study.user_attrs["confirmation"])
    conf["runs"] = {**conf["runs"], "0": {"values": [330.0, 260.0, 350.0], "failed": 0}}  # baseline as fast
    study.set_user_attr("confirmation", conf)
    ok, code, why = astuple(publish.decide(study, cfg()))
    assert not ok and code == "within_noise" and why.startswith("no measurable gain") and why.endswith("not beyond noise")


def test_the_output_gate_must_have_compared_and_passed_when_enabled():
    on = build_config({"model": {"path": "/m"}, "regression": {"enabled": True, "max_flip_rate": 0.1}})
    ok, code, why = astuple(publish.decide(finished_study(), on))
    assert not ok and code == "outputs" and "did not compare its outputs" in why


def test_the_baseline_winning_is_said_as_such():
    import optuna
    from tests.unit.driver.test_minimal import BASE_ARGS, WINNER_ARGS, _ask
    study = optuna.create_study(direction="minimize")
    for args, value, base in ((BASE_ARGS, 250.0, True), (WINNER_ARGS, 300.0, False)):
        t = _ask(study, args)
        t.set_user_attr("baseline", base)
        study.tell(t, value)
    study.set_user_attr("confirmation", {
        "runs": {"0": {"values": [250.0, 240.0, 260.0], "failed": 0}, "1": {"values": [300.0, 290.0, 315.0], "failed": 0}},
        "repeats": 2, "top": 2, "candidates": ["0", "1"], "baseline": 0, "disqualified": [], "winner": 0})
    ok, code, why = astuple(publish.decide(study, cfg()))
    assert not ok and code == "baseline_won"
    assert why == "the recommendation is the current configuration: the baseline itself measured best"


def test_every_change_put_back_is_said_as_such():
    study = with_minimal(finished_study())
    record = dict(study.user_attrs["minimal"])
    record["rows"] = [dict(r, verdict="reverted") for r in record["rows"]]
    record["final"] = dict(record["final"], args=list(study.trials[0].user_attrs["vllm_args"]))
    study.set_user_attr("minimal", record)
    ok, code, why = astuple(publish.decide(study, cfg()))
    assert not ok and code == "all_put_back" and "put back all 2 changed knob(s)" in why


def test_no_configuration_within_the_slos_is_said_as_such():
    import optuna
    study = optuna.create_study(direction="minimize")
    ok, code, why = astuple(publish.decide(study, cfg()))
    assert not ok and code == "no_feasible" and why == "no configuration completed within the SLOs"


def test_a_study_measured_on_random_weights_is_never_published():
    import optuna

    from tests.unit.driver.test_minimal import _ask

    study = finished_study()
    dummy = optuna.create_study(direction="minimize")
    for t in study.trials:  # the same study, its trials run with vLLM's dummy weights
        args = list(t.user_attrs["vllm_args"]) + ["--load-format", "dummy"]
        copy = _ask(dummy, args)
        for key, value in t.user_attrs.items():
            copy.set_user_attr(key, args if key == "vllm_args" else value)
        dummy.tell(copy, t.value)
    for key, value in study.user_attrs.items():
        dummy.set_user_attr(key, value)
    assert publish.decide(study, cfg()).publish
    ok, code, why = astuple(publish.decide(dummy, cfg()))
    assert not ok and code == "random_weights" and why.startswith("measured with random weights (--load-format dummy)")


def test_every_reason_code_is_documented():
    import inspect
    source = inspect.getsource(publish.decide) + inspect.getsource(publish._same_as_baseline)
    used = set(re.findall(r'Decision\((?:True|False), "(\w+)"', source))
    assert used == set(publish.REASONS)
    docs = (Path(__file__).parents[3] / "docs" / "daemon.md").read_text()
    assert all(f"`{code}`" in docs for code in publish.REASONS)


def test_the_payload_carries_flags_config_gain_generation_and_traffic():
    study = with_minimal(finished_study())
    study.set_user_attr("traffic_source", "/a/window-1.json")
    body = publish.payload(study, cfg(), "/m", 3)
    assert body["generation"] == 3 and body["source"] == "minimal change" and body["trial"] == 1
    assert body["config"]["max-num-seqs"] == 36 and body["command"].startswith("vllm serve /m --max-num-seqs 36")
    assert body["gain"]["low"] > 1 and body["traffic"]["source"] == "/a/window-1.json"
    json.dumps(body)  # plain JSON


def test_the_config_file_is_replaced_whole(tmp_path):
    path = tmp_path / "deploy" / "vllm.yaml"
    publish.write_config(path, {"max-num-seqs": 16})
    publish.write_config(path, {"max-num-seqs": 36, "enable-prefix-caching": True})
    assert yaml.safe_load(path.read_text()) == {"max-num-seqs": 36, "enable-prefix-caching": True}
    assert os.listdir(path.parent) == ["vllm.yaml"]  # no temporary file left


heard: list = []


@pytest.fixture
def receiver():
    """A local HTTP receiver: answers `codes` in turn (then 200; a 3xx points elsewhere) and keeps the
    bodies (and, in `heard`, each POST's headers and raw body)."""
    got, codes = [], []
    heard.clear()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            raw = self.rfile.read(int(self.headers["Content-Length"]))
            got.append(json.loads(raw))
            heard.append((dict(self.headers), raw))
            code = codes.pop(0) if codes else 200
            self.send_response(code)
            if 300 <= code < 400:
                self.send_header("Location", "/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self):  # where urllib would send a redirected POST, as a GET without its body
            got.append({"redirected": self.path})
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/hook", got, codes
    srv.shutdown()


def test_the_webhook_retries_until_the_receiver_takes_it(receiver):
    url, got, codes = receiver
    codes.extend([503])
    seen = []
    hook = publish.Webhook(url, 3, seen.append)
    t = time.monotonic()
    hook.send({"generation": 2, "flags": ["--max-num-seqs", "16"]})
    assert time.monotonic() - t < 0.5  # never blocks the loop
    hook.join(10)
    assert len(got) == 2 and got[1] == {"generation": 2, "flags": ["--max-num-seqs", "16"]}
    assert seen[-1]["state"] == "sent" and seen[-1]["attempts"] == 2 and seen[-1]["last_error"] is None
    assert any("HTTP 503" in (s["last_error"] or "") for s in seen)


def test_a_webhook_that_refuses_is_reported_failed_naming_the_url(receiver):
    url, got, codes = receiver
    codes.extend([500, 500])
    seen = []
    hook = publish.Webhook(url, 2, seen.append)
    hook.send({"generation": 1})
    hook.join(10)
    assert len(got) == 2 and seen[-1]["state"] == "failed"
    assert seen[-1]["last_error"] == (f"{url} refused the recommendation (HTTP 500); check the URL and that the "
                                      "receiver accepts a JSON POST")


def test_another_event_never_cancels_a_recommendation_still_being_retried(receiver):
    url, got, codes = receiver
    codes.extend([503])  # the recommendation's first attempt fails; it is retried 1 s later
    seen = []
    hook = publish.Webhook(url, 3, seen.append)
    hook.send({"event": "published", "generation": 2, "flags": ["--max-num-seqs", "16"]})
    time.sleep(0.3)
    hook.send({"event": "saturated", "generation": 2})
    deadline = time.monotonic() + 10
    while len(got) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sorted(b["event"] for b in got) == ["published", "published", "saturated"]
    assert got[-1]["event"] == "published"  # the retry still went out after the other event


def test_a_redirect_is_a_failed_attempt_never_a_bodiless_get_called_sent(receiver):
    url, got, codes = receiver
    codes.extend([302, 302])
    seen = []
    hook = publish.Webhook(url, 2, seen.append)
    hook.send({"generation": 1, "study": "s"})
    hook.join(10)
    assert all("redirected" not in g for g in got) and len(got) == 2
    assert seen[-1]["state"] == "failed"
    assert "(HTTP 302, a redirect: not followed; give the final URL)" in seen[-1]["last_error"]


def test_each_post_is_signed_with_the_secret_and_keyed_by_study_generation_and_event(receiver):
    import hashlib
    import hmac

    url, got, codes = receiver
    codes.extend([503])
    hook = publish.Webhook(url, 3, lambda s: None, secret=b"s3cret")
    hook.send({"event": "published", "study": "tune", "generation": 4, "flags": []})
    hook.join(10)
    assert len(heard) == 2
    for headers, raw in heard:  # the retry carries the same key and a valid signature
        assert headers["X-Optimizer-Signature-256"] == "sha256=" + hmac.new(b"s3cret", raw, hashlib.sha256).hexdigest()
        assert headers["Idempotency-Key"] == "tune:g4:published" and headers["X-Optimizer-Event"] == "published"
    unsigned = publish.Webhook(url, 1, lambda s: None)
    unsigned.send({"event": "saturated", "study": "tune", "generation": 4})
    unsigned.join(10)
    assert "X-Optimizer-Signature-256" not in heard[-1][0]


def test_a_url_carrying_a_secret_is_shown_masked(receiver):
    assert publish.redacted("https://bot:tok3n@hooks.example/x?key=abc&team=ops") == \
        "https://bot:***@hooks.example/x?key=***&team=***"
    assert publish.redacted("http://127.0.0.1:9/hook") == "http://127.0.0.1:9/hook"
    url, got, codes = receiver
    codes.extend([500])
    seen = []
    hook = publish.Webhook(url + "?token=abc", 1, seen.append)
    hook.send({"generation": 1})
    hook.join(10)
    assert all("abc" not in json.dumps(s) for s in seen) and seen[-1]["url"] == url + "?token=***"


def test_the_secret_file_is_read_at_start_and_a_missing_one_refused(tmp_path):
    from optimizer.config.daemon_spec import PublishSpec
    from optimizer.daemon.publisher import Publisher
    from optimizer.errors import ConfigError

    (tmp_path / "secret").write_text("abc123\n")
    spec = PublishSpec(webhook="http://127.0.0.1:9/h", webhook_secret_file=str(tmp_path / "secret"))
    assert Publisher(spec, None, None).webhook.secret == b"abc123"
    with pytest.raises(ConfigError, match="webhook_secret_file: .*missing cannot be read"):
        Publisher(spec.model_copy(update={"webhook_secret_file": str(tmp_path / "missing")}), None, None)


def test_a_body_never_delivered_is_kept_and_sent_again_after_a_restart_with_its_key(receiver, tmp_path):
    from optimizer.config.daemon_spec import PublishSpec
    from optimizer.daemon.publisher import Publisher

    url, got, codes = receiver
    codes.extend([500, 500])  # the receiver is down for this run's attempts
    outbox = tmp_path / "outbox"
    first = publish.Webhook(url, 2, lambda s: None, outbox=outbox)
    first.send({"event": "published", "study": "tune", "generation": 3, "flags": ["--max-num-seqs", "16"]})
    first.join(10)
    assert [p.name for p in outbox.iterdir()] == ["published.json"]
    # the daemon starts again (a stop in flight, or every attempt spent): the body goes out again, same key
    shown = []
    again = Publisher(PublishSpec(webhook=url), type("S", (), {"set": lambda self, **k: shown.append(k)})(),
                      type("C", (), {"print": lambda self, *a: None})(), outbox)
    assert again.resend() == 1
    again.webhook.join(10)
    assert got[-1] == {"event": "published", "study": "tune", "generation": 3, "flags": ["--max-num-seqs", "16"]}
    assert heard[-1][0]["Idempotency-Key"] == heard[0][0]["Idempotency-Key"] == "tune:g3:published"
    assert not list(outbox.iterdir())  # delivered: nothing left to send
    assert Publisher(PublishSpec(webhook=url), None, None, outbox).resend() == 0
