"""config/model_info.py without the network: a Hugging Face id whose Hub cannot be reached fails
in one line after one attempt (huggingface_hub's own retries slept 1+2+4+8+8 s first), the
cache still serves when the Hub is gone, and a path that exists as the wrong kind says what it is.

The Hub is a local HTTP server (or a closed 127.0.0.1 port) named by HF_ENDPOINT, and each
lookup runs in a fresh interpreter: huggingface_hub reads HF_ENDPOINT, HF_HOME and
HF_HUB_OFFLINE when it is imported.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from optimizer.cli import main
from optimizer.config.model_info import load_model_info
from optimizer.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
TROUBLESHOOTING = ROOT / "docs" / "troubleshooting.md"
REPO = "someorg/somemodel"
FETCH = (f"pass a local model directory: on a machine with access run `hf download {REPO} --local-dir DIR` "
         "and copy DIR here")
LOOKUP = """
import json, sys, time
from optimizer.config.model_info import load_model_info
from optimizer.errors import ConfigError
start = time.monotonic()
try:
    info = load_model_info(sys.argv[1])
    out = {"layers": info.layers, "vocab_size": info.vocab_size}
except ConfigError as exc:
    out = {"error": str(exc), "exit_code": exc.exit_code}
out["seconds"] = time.monotonic() - start
print(json.dumps(out))
"""
# huggingface_hub's retry loop, when it runs, sleeps 1+2+4+8+8 s before its last attempt
RETRY_SLEEP_S = 23


class FakeHub:
    """A Hub on 127.0.0.1 that answers every request with `status` (and `headers`), or serves
    `files` ({path: bytes}) the way the Hub's /resolve/ endpoint does; it counts the requests."""

    def __init__(self, status: int = 200, headers: dict | None = None, files: dict | None = None):
        self.requests: list[tuple[str, str]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, body: bool):
                hub.requests.append((self.command, self.path))
                data = (files or {}).get(self.path)
                if files is None:
                    code, extra = status, dict(headers or {})
                else:
                    code, extra = (200, {}) if data is not None else (404, {"X-Error-Code": "RepoNotFound"})
                self.send_response(code)
                for key, value in extra.items():
                    self.send_header(key, value)
                if data is not None:
                    self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
                    self.send_header("X-Repo-Commit", "0123456789abcdef0123456789abcdef01234567")
                self.send_header("Content-Length", str(len(data) if data is not None else 0))
                self.end_headers()
                if body and data is not None:
                    self.wfile.write(data)

            def do_HEAD(self):
                self._answer(body=False)

            def do_GET(self):
                self._answer(body=True)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def closed_port_url() -> str:
    """An endpoint nothing listens on: every connection is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def hub_env(tmp_path: Path, endpoint: str, offline: bool = False) -> dict:
    env = {k: v for k, v in os.environ.items()  # no proxy either: 127.0.0.1 is asked directly
           if not k.startswith(("HF_", "HUGGINGFACE_")) and k not in ("TRANSFORMERS_OFFLINE",)
           and not k.lower().endswith("_proxy")}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_TELEMETRY="1")
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env


def reason(line: str) -> str:
    """The line with its connection error (worded by httpx and the OS) as `<reason>`."""
    return re.sub(r"\(ConnectError: [^)]*\)", "(<reason>)", line)


def lookup(tmp_path: Path, endpoint: str, offline: bool = False, source: str = REPO) -> dict:
    done = subprocess.run([sys.executable, "-c", LOOKUP, source], env=hub_env(tmp_path, endpoint, offline),
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stderr == "", done.stderr  # nothing printed: no retry warnings
    return json.loads(done.stdout)


# --- an unreachable Hub -----------------------------------------------------------------------


def test_a_closed_hub_port_is_one_line_after_one_attempt(tmp_path):
    endpoint = closed_port_url()
    got = lookup(tmp_path, endpoint)
    assert got["exit_code"] == 2
    assert reason(got["error"]) == (f"model: {REPO} is not a local directory and not in the Hugging Face cache, and "
                                    f"the Hub ({endpoint}) cannot be reached (<reason>); {FETCH} (or copy its Hugging "
                                    "Face cache here and set HF_HUB_OFFLINE=1)")
    assert "ConnectError: [Errno " in got["error"]  # the refused connection, as httpx words it
    assert got["seconds"] < RETRY_SLEEP_S  # the retry loop alone would sleep 23 s; this takes well under 1 s


def test_a_hub_that_answers_503_is_asked_once(tmp_path):
    with FakeHub(status=503) as hub:
        got = lookup(tmp_path, hub.url)
    assert hub.requests == [("HEAD", f"/{REPO}/resolve/main/config.json")]  # huggingface_hub alone: 7 requests
    assert got["error"] == (f"model: the Hugging Face Hub ({hub.url}) answered HTTP 503 for config.json of {REPO}, "
                            f"and the Hugging Face cache does not hold it; try again later, or {FETCH}")


def test_an_endpoint_that_is_no_hub_says_to_check_it(tmp_path):
    with FakeHub(status=404) as hub:  # a 404 without the Hub's X-Error-Code: some other web server
        got = lookup(tmp_path, hub.url)
    assert len(hub.requests) == 1
    assert got["error"] == (f"model: the Hugging Face Hub ({hub.url}) answered HTTP 404 for config.json of {REPO}, "
                            f"and the Hugging Face cache does not hold it; check the id and HF_ENDPOINT, or {FETCH}")


def test_an_unknown_repo_is_named_after_one_request(tmp_path):
    with FakeHub(status=401, headers={"X-Error-Code": "RepoNotFound"}) as hub:
        got = lookup(tmp_path, hub.url)
    assert len(hub.requests) == 1
    assert got["error"] == (f"model: no Hugging Face model {REPO} (or it is private: log in with `hf auth login`); "
                            "check the id, or pass a local model directory")


def test_offline_mode_never_asks_the_hub(tmp_path):
    with FakeHub(status=503) as hub:
        got = lookup(tmp_path, hub.url, offline=True)
    assert hub.requests == []
    assert got["error"] == (f"model: {REPO} is not a local directory, and HF_HUB_OFFLINE is set but the Hugging Face "
                            f"cache ({tmp_path / 'hf-home' / 'hub'}) does not hold it; {FETCH} (or unset "
                            "HF_HUB_OFFLINE where the Hub can be reached)")


def test_the_hubs_config_is_read_then_the_cache_serves_when_the_hub_is_gone(tmp_path, tiny_model):
    config = (Path(tiny_model) / "config.json").read_bytes()
    expected = {"layers": json.loads(config)["num_hidden_layers"], "vocab_size": json.loads(config)["vocab_size"]}
    with FakeHub(files={f"/{REPO}/resolve/main/config.json": config}) as hub:
        got = lookup(tmp_path, hub.url)
    assert {k: got.get(k) for k in expected} == expected, got
    assert [m for m, _ in hub.requests].count("GET") == 1  # downloaded once, into HF_HOME's cache
    for offline in (False, True):  # the Hub gone (one refused attempt, then the cache), or not asked at all
        got = lookup(tmp_path, closed_port_url(), offline=offline)
        assert {k: got.get(k) for k in expected} == expected, got


def test_the_workload_command_with_an_unreachable_hub_is_one_line_exit_2_and_writes_nothing(tmp_path):
    endpoint = closed_port_url()
    out = tmp_path / "out"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "optimizer", "workload", "--config", "examples/quickstart.yaml",
                           "--model", REPO, "--out", str(out)], env=hub_env(tmp_path, endpoint), cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    elapsed = time.monotonic() - started
    assert done.returncode == 2
    assert [reason(line) for line in done.stderr.splitlines()] == [
        (f"error: model: {REPO} is not a local directory and not in the Hugging Face cache, and the Hub ({endpoint}) "
         f"cannot be reached (<reason>); {FETCH} (or copy its Hugging Face cache here and set HF_HUB_OFFLINE=1)")]
    assert not out.exists()
    assert elapsed < RETRY_SLEEP_S
    row = reason(done.stderr.strip()).replace(endpoint, "https://huggingface.co")
    assert f"`` {row} ``" in TROUBLESHOOTING.read_text()  # the docs' row, word for word


# --- a path that is there, but not a directory ----------------------------------------------------


def test_a_file_given_as_the_model_says_it_is_a_file(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\0" * 16)
    with pytest.raises(ConfigError) as err:
        load_model_info(str(weights))
    assert str(err.value) == (f"model: {weights} is a file; pass a model directory (the one holding config.json), "
                              "a Hugging Face id (org/name), or run `python -m optimizer tiny-model DIR` first")
    relative = "model.safetensors"  # a relative name that also looks like nothing on the Hub
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        with pytest.raises(ConfigError, match=f"^model: {relative} is a file; pass a model directory"):
            load_model_info(relative)
    finally:
        os.chdir(cwd)


def test_the_models_config_json_given_as_the_model_names_its_directory(tiny_model):
    config = Path(tiny_model) / "config.json"
    with pytest.raises(ConfigError) as err:
        load_model_info(str(config))
    assert str(err.value) == f"model: {config} is a file; pass the model directory that holds it ({tiny_model})"


def test_something_that_is_neither_file_nor_directory_says_so():
    with pytest.raises(ConfigError, match=r"^model: /dev/null is not a directory; pass a model directory"):
        load_model_info("/dev/null")


def test_a_missing_model_still_says_it_does_not_exist(tmp_path):
    with pytest.raises(ConfigError, match=f"^model: directory {tmp_path / 'nope'} does not exist; "):
        load_model_info(str(tmp_path / "nope"))


def test_the_cli_refuses_a_model_file_in_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.bin").write_bytes(b"\0")
    (tmp_path / "study.yaml").write_text("workload: {requests: 4}\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    code = main(["workload", "--config", "study.yaml", "--model", str(tmp_path / "model.bin"),
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.splitlines()
    expected = ("error: model: <dir>/model.bin is a file; pass a model directory (the one holding config.json), a "
                "Hugging Face id (org/name), or run `python -m optimizer tiny-model DIR` first")
    assert code == 2 and [e.replace(str(tmp_path), "<dir>") for e in err] == [expected]
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert f"`` {expected} ``" in TROUBLESHOOTING.read_text()  # the docs' row, word for word
