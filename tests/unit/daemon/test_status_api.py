"""daemon/status_api.py: a real status server on 127.0.0.1 (port 0), asked over real HTTP."""

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from optimizer.daemon.metrics_page import CONTENT_TYPE as METRICS_CONTENT_TYPE
from optimizer.daemon.metrics_page import prometheus_text
from optimizer.daemon.status_api import STATES, StatusServer, StatusState, is_loopback
from optimizer.errors import ConfigError

COMMAND = "vllm serve /models/llama --max-num-seqs 64 --gpu-memory-utilization 0.9"


def realistic_state(**kwargs) -> StatusState:
    state = StatusState(**kwargs)
    state.set(
        state="tuning", study="chat-llama", storage="postgresql://opt:***@db/optuna", generation=3,
        n_trials=40, trials={"COMPLETE": 7, "PRUNED": 2, "FAIL": 1, "RUNNING": 1},
        running={"number": 11, "phase": "replaying", "params": {"max_num_seqs": 64}, "since": time.time()},
        best={"number": 4, "value": 0.182, "objective": "latency", "metric": "ttft_p95", "unit": "s",
              "direction": "minimize", "command": COMMAND},
        watch=None, last_error=None,
    )
    return state


def get(url: str, token: str | None = None, method: str = "GET") -> tuple[int, dict, bytes]:
    """(status, headers, body) of one request; HTTP errors are answers, not exceptions."""
    request = urllib.request.Request(url, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def samples(text: str) -> dict[tuple, float]:
    """{(name, sorted label items): value} of every sample in a Prometheus text body."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture
def server():
    with StatusServer(realistic_state(), port=0) as srv:
        yield srv


def test_healthz_and_status_answer_with_the_snapshot(server):
    status, _, body = get(f"{server.url}/healthz")
    health = json.loads(body)
    assert status == 200 and health["ok"] is True and health["state"] == "tuning"
    assert 0 <= health["heartbeat_age_s"] < 5

    status, headers, body = get(f"{server.url}/status")
    snap = json.loads(body)
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    assert snap["study"] == "chat-llama" and snap["generation"] == 3 and snap["n_trials"] == 40
    assert snap["trials"]["COMPLETE"] == 7 and snap["running"]["phase"] == "replaying"
    assert snap["best"]["command"] == COMMAND and snap["watch"] is None and snap["last_error"] is None
    assert isinstance(snap["pid"], int) and snap["uptime_s"] >= 0 and "heartbeat_age_s" in snap


def test_metrics_hold_the_exact_values(server):
    status, headers, body = get(f"{server.url}/metrics")
    assert status == 200 and headers["Content-Type"] == METRICS_CONTENT_TYPE
    got = samples(body.decode())
    study = ("study", "chat-llama")
    assert got[("vllm_optimizer_up", ())] == 1
    assert got[("vllm_optimizer_uptime_seconds", ())] >= 0
    assert got[("vllm_optimizer_heartbeat_age_seconds", ())] >= 0
    assert {s: got[("vllm_optimizer_state", (("state", s),))] for s in STATES} == {
        s: float(s == "tuning") for s in STATES}
    assert got[("vllm_optimizer_generation", (study,))] == 3
    assert got[("vllm_optimizer_trials_budget", (study,))] == 40
    trials = {s: got[("vllm_optimizer_trials", (("state", s), study))]
              for s in ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")}
    assert trials == {"COMPLETE": 7, "PRUNED": 2, "FAIL": 1, "RUNNING": 1, "WAITING": 0}
    assert got[("vllm_optimizer_running_trial", (("phase", "replaying"), study))] == 11
    best = (("direction", "minimize"), ("metric", "ttft_p95"), study, ("unit", "s"))
    assert got[("vllm_optimizer_best_value", best)] == pytest.approx(0.182)
    assert got[("vllm_optimizer_best_trial", (study,))] == 4
    assert "# TYPE vllm_optimizer_best_value gauge" in body.decode()


def test_metrics_leave_out_what_is_missing():
    snap = StatusState().snapshot()  # nothing set yet: not even a state
    names = {name for name, _ in samples(prometheus_text(snap))}
    assert names == {"vllm_optimizer_up", "vllm_optimizer_uptime_seconds",
                     "vllm_optimizer_heartbeat_age_seconds", "vllm_optimizer_state"}
    text = prometheus_text({"state": "watching", "running": None, "best": None, "generation": None})
    assert "running_trial" not in text and "best_" not in text and "generation" not in text
    assert samples(text)[("vllm_optimizer_state", (("state", "watching"),))] == 1


def test_label_values_are_escaped():
    study = 'chat "v2"\\prod\nnight'
    text = prometheus_text({"study": study, "generation": 1})
    assert r'study="chat \"v2\"\\prod\nnight"' in text
    assert samples(text)[("vllm_optimizer_generation", (("study", study),))] == 1


def test_healthz_turns_503_when_the_driver_goes_silent():
    state = realistic_state(stale_after_s=60)
    with StatusServer(state, port=0) as srv:
        state._heartbeat -= 125  # the driver loop last beat two minutes ago
        status, _, body = get(f"{srv.url}/healthz")
        assert status == 503
        assert json.loads(body)["ok"] is False and json.loads(body)["reason"] == "driver loop silent for 125 s"
        state.beat()
        assert get(f"{srv.url}/healthz")[0] == 200


def test_unknown_path_is_404_and_other_methods_405(server):
    status, headers, body = get(f"{server.url}/nope")
    assert status == 404 and "error" in json.loads(body)
    status, headers, body = get(f"{server.url}/status", method="POST")
    assert status == 405 and "error" in json.loads(body) and "GET" in headers["Allow"]


def test_token_is_required_on_every_endpoint_when_set():
    with StatusServer(realistic_state(), port=0, token="s3cret") as srv:
        for path in ("/healthz", "/status", "/metrics", "/nope"):
            status, headers, body = get(f"{srv.url}{path}")
            assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
            assert json.loads(body) == {"error": "missing or wrong bearer token"}
            assert get(f"{srv.url}{path}", token="wrong")[0] == 401
        for path in ("/healthz", "/status", "/metrics"):
            assert get(f"{srv.url}{path}", token="s3cret")[0] == 200


def test_network_bind_without_token_is_refused_before_binding():
    for host in ("0.0.0.0", "::", "10.1.2.3", "status.example.com"):
        with pytest.raises(ConfigError, match=f"binding {host} exposes the daemon.*OPTIMIZER_STATUS_TOKEN"):
            StatusServer(StatusState(), host=host, port=0)


def test_network_bind_with_token_works_and_asks_for_it():
    with StatusServer(realistic_state(), host="0.0.0.0", port=0, token="s3cret") as srv:
        assert srv.port > 0
        assert get(f"http://127.0.0.1:{srv.port}/status")[0] == 401
        assert get(f"http://127.0.0.1:{srv.port}/status", token="s3cret")[0] == 200


def test_port_in_use_is_a_config_error_naming_the_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {port} on 127.0.0.1 is in use.*--status-port"):
            StatusServer(StatusState(), port=port).start()


def test_bad_port_and_foreign_address_are_config_errors():
    with pytest.raises(ConfigError, match="not a TCP port"):
        StatusServer(StatusState(), port=70000)
    with pytest.raises(ConfigError, match="cannot bind 192.0.2.1 port 0"):  # TEST-NET-1: not ours
        StatusServer(StatusState(), host="192.0.2.1", port=0, token="t").start()


def test_stop_frees_the_port_and_is_idempotent():
    srv = StatusServer(realistic_state(), port=0).start()
    port = srv.port
    assert get(f"{srv.url}/healthz")[0] == 200
    began = time.monotonic()
    srv.stop()
    srv.stop()
    assert time.monotonic() - began < 2.5
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
    with StatusServer(realistic_state(), port=port) as again:  # a restarted daemon gets its port back
        assert again.port == port and get(f"{again.url}/healthz")[0] == 200
    StatusServer(StatusState(), port=0).stop()  # never started: nothing to do


@pytest.mark.parametrize("host, expected", [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("LOCALHOST", True), ("::ffff:127.0.0.1", True), ("0.0.0.0", False), ("::", False), ("", False),
    ("10.0.0.5", False), ("192.168.1.2", False), ("fe80::1", False), ("example.com", False),
])
def test_is_loopback(host, expected):
    assert is_loopback(host) is expected


def test_snapshot_is_a_copy_and_set_copies_in():
    state = realistic_state()
    snap = state.snapshot()
    snap["trials"]["COMPLETE"] = 999
    snap["best"]["value"] = -1
    snap["study"] = "other"
    again = state.snapshot()
    assert again["trials"]["COMPLETE"] == 7 and again["best"]["value"] == 0.182 and again["study"] == "chat-llama"
    trials = {"COMPLETE": 1}
    state.set(trials=trials)
    trials["COMPLETE"] = 2
    assert state.snapshot()["trials"] == {"COMPLETE": 1}


def test_state_survives_concurrent_writers_and_readers():
    state = StatusState()
    errors = []

    def write(k):
        for i in range(300):
            state.set(trials={"COMPLETE": i, "RUNNING": k}, generation=i)
            state.beat()

    def read():
        try:
            for _ in range(300):
                snap = state.snapshot()
                json.dumps(snap)
                prometheus_text(snap)
        except Exception as exc:  # a torn read shows up here
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(k,)) for k in range(3)]
    threads += [threading.Thread(target=read) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and state.snapshot()["generation"] == 299


def test_set_refuses_an_unknown_state_or_a_computed_field():
    state = StatusState()
    with pytest.raises(ValueError, match="not one of"):
        state.set(state="sleeping")
    with pytest.raises(ValueError, match="computed"):
        state.set(pid=1)


def test_recommendation_is_404_until_one_is_published_then_the_json():
    state = realistic_state()
    state.set(publish={"decision": {"published": False, "reason": "only single runs"}})
    with StatusServer(state, port=0) as srv:
        status, _, body = get(f"{srv.url}/recommendation")
        assert status == 404 and json.loads(body) == {"error": "nothing published yet", "last_decision": {
            "decision": {"published": False, "reason": "only single runs"}}}
        rec = {"generation": 2, "flags": ["--max-num-seqs", "16"], "gain": {"ratio": 1.4, "low": 1.2, "high": 1.6}}
        state.set(recommendation=rec)
        status, headers, body = get(f"{srv.url}/recommendation")
        assert status == 200 and json.loads(body) == rec and headers["Content-Type"].startswith("application/json")
