"""daemon/publish.py: the gate, the atomic `vllm serve --config` file, and the webhook (a real
local HTTP receiver)."""

import http.server
import json
import os
import threading
import time

import pytest
import yaml

from optimizer.config.schema import build_config
from optimizer.daemon import publish
from tests.unit.driver.test_minimal import finished_study
from tests.unit.report.test_recommendation import with_minimal


def cfg(**daemon):
    return build_config({"model": {"path": "/m"}, "daemon": {"publish": daemon}})


def test_a_confirmed_gain_beyond_noise_is_published():
    ok, why = publish.decide(finished_study(), cfg())
    assert ok and why.endswith("over the current configuration") and "95% CI" in why


def test_a_gain_below_min_gain_is_recorded_not_published():
    ok, why = publish.decide(finished_study(), cfg(min_gain=20.0))
    assert not ok and "below daemon.publish.min_gain (2000%)" in why


def test_single_runs_are_never_published():
    study = finished_study()
    study.set_user_attr("confirmation", {})
    ok, why = publish.decide(study, cfg())
    assert not ok and "the confirmation did not run" in why


def test_a_gain_within_noise_is_not_published():
    study = finished_study()
    conf = dict(study.user_attrs["confirmation"])
    conf["runs"] = {**conf["runs"], "0": {"values": [330.0, 260.0, 350.0], "failed": 0}}  # baseline as fast
    study.set_user_attr("confirmation", conf)
    ok, why = publish.decide(study, cfg())
    assert not ok and why.startswith("no measurable gain") and why.endswith("not beyond noise")


def test_the_output_gate_must_have_compared_and_passed_when_enabled():
    on = build_config({"model": {"path": "/m"}, "regression": {"enabled": True, "max_flip_rate": 0.1}})
    ok, why = publish.decide(finished_study(), on)
    assert not ok and "did not compare its outputs" in why


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


@pytest.fixture
def receiver():
    """A local HTTP receiver: answers `codes` in turn (then 200) and keeps the bodies."""
    got, codes = [], []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(codes.pop(0) if codes else 200)
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
