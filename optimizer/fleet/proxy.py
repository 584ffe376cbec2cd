"""A real reverse proxy in front of replicas: nginx, configured and started by the tool.

The config is what an operator runs in front of vLLM replicas: a least-connections upstream
(a long generation holds its replica, so round-robin would pile new requests onto a busy one),
HTTP/1.1 with keep-alive to the replicas, and streaming passed on unbuffered (proxy_buffering
off: each token reaches the client when the replica sends it, so TTFT and ITL measured through
the proxy are the client's). It listens on 127.0.0.1 only. `/metrics` is refused through the
proxy: each replica's counters are read from the replica itself (one scrape through a balancer
would read one replica at random).

nginx runs in the foreground (`daemon off`) under the lifeline guard (engine/lifeline.py), in a
process group of its own: it stops with its owner, SIGKILL included. Its files (config, pid,
logs, temporary bodies) live in one directory the caller owns.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

from optimizer.http_open import urlopen
from optimizer.engine import lifeline
from optimizer.engine.vllm import HOST, free_port, port_is_free, terminate_group
from optimizer.errors import ConfigError

INSTALL = "install Debian's package: apt-get install nginx-light (or nginx)"
READY_S = 15.0


def nginx_binary() -> str:
    """The nginx to run; ConfigError naming the package when there is none."""
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx")
                                          if os.access(p, os.X_OK)), None)
    if found is None:
        raise ConfigError(f"nginx not found: the replicas are measured behind a real nginx; {INSTALL}")
    return found


def check_port(port: int) -> None:
    """ConfigError when the proxy's port is taken (before any replica boots)."""
    if not port_is_free(port):
        raise ConfigError(f"the proxy's port {port} on {HOST} is in use: free it, or pass another (--proxy-port), "
                          "or 0 for any free port")


def quoted(path: Path) -> str:
    """A path as one nginx parameter: in double quotes, its quotes and backslashes escaped (a
    directory with a space or a ';' in its name then stays one path)."""
    return '"' + str(path).replace("\\", "\\\\").replace('"', '\\"') + '"'


def config_text(directory: Path, port: int, upstreams: list[str]) -> str:
    """nginx.conf for `upstreams` ("127.0.0.1:8001", ...) behind 127.0.0.1:`port`."""
    d = directory.resolve()

    def at(name: str) -> str:
        return quoted(d / name)

    servers = "\n".join(f"        server {u} max_fails=0;" for u in upstreams)
    user = "user root;\n" if os.geteuid() == 0 else ""  # workers write the temporary files in `directory`
    return f"""{user}daemon off;
master_process on;
worker_processes 1;
pid {at("nginx.pid")};
error_log {at("error.log")} warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {at("body")};
    proxy_temp_path {at("proxy")};
    fastcgi_temp_path {at("fastcgi")};
    uwsgi_temp_path {at("uwsgi")};
    scgi_temp_path {at("scgi")};
    client_max_body_size 0;
    client_body_buffer_size 4m;
    upstream vllm {{
        least_conn;
{servers}
        keepalive 64;
    }}
    server {{
        listen {HOST}:{port};
        location = /metrics {{ return 404 "each replica's /metrics is read from the replica\\n"; }}
        location / {{
            proxy_pass http://vllm;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 3600s;
            proxy_send_timeout 3600s;
        }}
    }}
}}
"""


class Proxy:
    """nginx in front of `upstreams`; a context manager. `start()` raises ConfigError for what the
    operator must fix (no nginx, a port it cannot bind) and RuntimeError for anything else."""

    def __init__(self, directory: Path, upstreams: list[str], port: int = 0):
        self.directory, self.upstreams = Path(directory), list(upstreams)
        self.port = port
        self.proc: subprocess.Popen | None = None
        self._lifeline: int | None = None

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def conf(self) -> Path:
        return self.directory / "nginx.conf"

    def start(self) -> "Proxy":
        if self.port:  # the port first: a taken port is named whether or not nginx is installed
            check_port(self.port)
        binary = nginx_binary()
        if not self.port:
            self.port = free_port()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(config_text(self.directory, self.port, self.upstreams))
        log = (self.directory / "nginx.out").open("w")
        read_end, self._lifeline = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", lifeline.__file__, str(read_end), str(lifeline.GRACE_S), "--",
                 binary, "-p", str(self.directory.resolve()), "-c", str(self.conf.resolve()),
                 "-e", str((self.directory / "error.log").resolve())],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, pass_fds=(read_end,),
                process_group=0)
        finally:
            os.close(read_end)
            log.close()
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise self._failure()
            try:
                with urlopen(f"{self.base_url}/metrics", timeout=2):
                    pass
            except urllib.error.HTTPError as exc:
                if exc.code == 404:  # nginx itself answered
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"nginx did not answer on {self.base_url} within {READY_S:.0f} s: {self.log_tail()}")

    def _failure(self) -> Exception:
        tail = self.log_tail()
        if "bind()" in tail or "Address already in use" in tail or "Permission denied" in tail:
            return ConfigError(f"nginx cannot listen on {HOST}:{self.port} ({tail}): free the port or pass "
                               "another (--proxy-port), or 0 for any free port")
        return RuntimeError(f"nginx exited at start: {tail}")

    def log_tail(self) -> str:
        lines = []
        for name in ("nginx.out", "error.log"):
            try:
                lines += (self.directory / name).read_text(errors="replace").splitlines()
            except OSError:
                continue
        real = [x for x in lines if x.strip() and not x.startswith(lifeline.NOTE_PREFIX)]
        return real[-1].strip() if real else "no output"

    def stop(self) -> None:
        try:
            if self.proc is not None and self.proc.poll() is None:
                terminate_group(self.proc.pid, 5.0, self.proc)
            elif self.proc is not None:
                terminate_group(self.proc.pid, 1.0, self.proc)  # what the guard left, if anything
        finally:
            if self._lifeline is not None:
                os.close(self._lifeline)
                self._lifeline = None

    def __enter__(self) -> "Proxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
