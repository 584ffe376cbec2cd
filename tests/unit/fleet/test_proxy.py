"""fleet/proxy.py on a real nginx (Debian's package, scripts/nginx_for_tests.sh): the config an
operator expects, the refusals (no nginx, a port taken or not bindable), streaming passed on
unbuffered, and nginx stopping with its owner, SIGKILL included. The upstreams here are small
local HTTP servers standing for vLLM replicas: what is pinned is the proxy's timing and its
balancing, not a model's answers (tests/integration/test_fleet_on_vllm.py runs real replicas)."""

from __future__ import annotations

import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from optimizer.errors import ConfigError
from optimizer.fleet import proxy
from optimizer.fleet.proxy import Proxy, config_text

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "nginx_for_tests.sh"


@pytest.fixture(scope="module")
def nginx():
    run = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=600)
    if run.returncode != 0 or not run.stdout.strip():
        pytest.fail(f"no nginx for the tests: {SCRIPT.name} exited {run.returncode} "
                    f"({(run.stderr.strip().splitlines() or ['no output'])[-1]})", pytrace=False)
    return run.stdout.strip().splitlines()[-1]


class Upstream(http.server.BaseHTTPRequestHandler):
    """A replica stand-in: POST streams two chunks a second apart; GET answers which one it is."""
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        body = str(self.server.server_address[1]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for part in (b"first", b"second"):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.flush()
            time.sleep(1.0)
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args):
        pass


@pytest.fixture
def upstreams():
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream) for _ in range(2)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    yield [f"127.0.0.1:{s.server_address[1]}" for s in servers]
    for s in servers:
        s.shutdown()


def test_the_config_is_what_an_operator_puts_in_front_of_vllm(tmp_path):
    text = config_text(tmp_path, 8080, ["127.0.0.1:8001", "127.0.0.1:8002"])
    assert "least_conn;" in text and "listen 127.0.0.1:8080;" in text
    assert "server 127.0.0.1:8001 max_fails=0;" in text and "server 127.0.0.1:8002 max_fails=0;" in text
    for line in ("proxy_buffering off;", "proxy_http_version 1.1;", 'proxy_set_header Connection "";',
                 "daemon off;", "keepalive 64;"):
        assert line in text
    assert "location = /metrics { return 404" in text


def test_no_nginx_is_one_line_naming_the_package(monkeypatch):
    monkeypatch.setattr(proxy.shutil, "which", lambda name: None)
    monkeypatch.setattr(proxy.os, "access", lambda path, mode: False)
    with pytest.raises(ConfigError) as got:
        proxy.nginx_binary()
    assert "nginx not found" in str(got.value) and "apt-get install nginx-light" in str(got.value)


def test_a_port_taken_is_refused_before_nginx_starts(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(ConfigError, match=f"proxy's port {port} on 127.0.0.1 is in use"):
            Proxy(tmp_path, ["127.0.0.1:1"], port).start()
    assert not (tmp_path / "nginx.conf").exists()


def test_a_port_nginx_cannot_bind_is_named(nginx, tmp_path, monkeypatch):
    monkeypatch.setattr(proxy, "check_port", lambda port: None)  # as if taken between the check and the start
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(ConfigError, match=f"nginx cannot listen on 127.0.0.1:{port}"):
            Proxy(tmp_path, ["127.0.0.1:1"], port).start()


def test_streams_pass_as_they_come_and_both_replicas_serve(nginx, tmp_path, upstreams):
    with Proxy(tmp_path, upstreams) as p:
        t = time.monotonic()
        with urllib.request.urlopen(urllib.request.Request(p.base_url + "/v1/completions", data=b"{}"),
                                    timeout=10) as resp:
            first = resp.read1(64)
            first_s = time.monotonic() - t
            rest = resp.read()
        total_s = time.monotonic() - t
        assert first.startswith(b"first") and rest.endswith(b"second"), (first, rest)
        assert total_s - first_s > 0.7, (first_s, total_s)  # the first chunk came a second before the end
        served = {urllib.request.urlopen(p.base_url + "/health", timeout=5).read().decode() for _ in range(8)}
        assert served == {u.rsplit(":", 1)[1] for u in upstreams}
        with pytest.raises(urllib.error.HTTPError) as metrics:
            urllib.request.urlopen(p.base_url + "/metrics", timeout=5)
        assert metrics.value.code == 404


def _nginx_of(directory: Path) -> list[int]:
    conf = str((directory / "nginx.conf").resolve())
    return [q.pid for q in psutil.process_iter(["cmdline"]) if conf in " ".join(q.info["cmdline"] or [])]


def test_nginx_dies_with_its_owner_killed(nginx, tmp_path, upstreams):
    code = (f"import sys, time; from pathlib import Path; from optimizer.fleet.proxy import Proxy\n"
            f"Proxy(Path({str(tmp_path)!r}), {upstreams!r}).start(); print('up', flush=True); time.sleep(600)\n")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[3])
    assert owner.stdout.readline() == "up\n"
    assert _nginx_of(tmp_path), "nginx was not running"
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 10
    while _nginx_of(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _nginx_of(tmp_path) == []


def test_a_directory_with_a_space_and_a_semicolon_stays_one_path_for_nginx(nginx, tmp_path, upstreams):
    odd = tmp_path / 'my study; "x"'
    odd.mkdir()
    with Proxy(odd, upstreams) as p:
        assert urllib.request.urlopen(p.base_url + "/health", timeout=5).status == 200
    assert (odd / "error.log").exists() and (odd / "proxy").is_dir()
