"""The daemon's status API: `/healthz`, `/status` (JSON), `/recommendation` (the published
recommendation, JSON) and `/metrics` (Prometheus text, daemon/metrics_page.py).

The driver is synchronous, so the aiohttp server runs in a daemon thread with its own
event loop. The driver writes what it is doing into a `StatusState` (and beats its
heartbeat from its loops); the server only reads snapshots of it. `/healthz` turns 503
when the heartbeat is older than `stale_after_s`: a stuck driver, not a dead process.

Bound to loopback by default. Any other address needs a bearer token (refused before
binding otherwise); with a token set, every endpoint asks for `Authorization: Bearer`.
"""

from __future__ import annotations

import asyncio
import copy
import errno
import hmac
import ipaddress
import json
import os
import socket
import threading
import time

from aiohttp import web

from optimizer.daemon.metrics_page import (
    CONTENT_TYPE,
    STATES,
    TRIAL_STATES,
    prometheus_text,
)
from optimizer.errors import ConfigError

__all__ = ["STATES", "TRIAL_STATES", "StatusServer", "StatusState", "is_loopback"]

DEFAULT_PORT = 8321
TOKEN_ENV = "OPTIMIZER_STATUS_TOKEN"
START_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 2.0
_COMPUTED = ("pid", "started", "uptime_s", "heartbeat_age_s")


class StatusState:
    """Thread-safe holder of what the daemon reports: the driver writes, the status server reads."""

    def __init__(self, stale_after_s: float = 300.0):
        self.stale_after_s = stale_after_s
        self.started = time.time()
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._fields: dict = {}
        self._started_mono = time.monotonic()
        self._heartbeat = self._started_mono  # monotonic: a wall-clock jump is not a stall

    def set(self, **fields) -> None:
        """Replace top-level fields (copied in, so the caller may keep mutating its dicts);
        also refreshes the heartbeat. Raises ValueError on an unknown `state` or a computed field."""
        self.put(fields, beat=True)

    def put(self, fields: dict, beat: bool) -> None:
        """`set`, refreshing the heartbeat only with `beat`: a thread beside the driver's loop (the
        watch during a generation) must not make a stuck loop look alive."""
        if "state" in fields and fields["state"] not in STATES:
            raise ValueError(f"status state {fields['state']!r} is not one of {', '.join(STATES)}")
        reserved = sorted(set(fields) & set(_COMPUTED))
        if reserved:
            raise ValueError(f"status fields {', '.join(reserved)} are computed; do not set them")
        fields = copy.deepcopy(fields)
        with self._lock:
            self._fields.update(fields)
            if beat:
                self._heartbeat = time.monotonic()

    def beat(self) -> None:
        """Refresh the heartbeat only (the driver calls it from its loops)."""
        with self._lock:
            self._heartbeat = time.monotonic()

    def heartbeat_age(self) -> float:
        """Seconds since the last `set` or `beat`."""
        with self._lock:
            return time.monotonic() - self._heartbeat

    def snapshot(self) -> dict:
        """A deep copy of the fields plus "pid", "started", "uptime_s" and "heartbeat_age_s"."""
        with self._lock:
            snap = copy.deepcopy(self._fields)
            heartbeat = self._heartbeat
        now = time.monotonic()
        snap.update(pid=self.pid, started=self.started, uptime_s=round(now - self._started_mono, 3),
                    heartbeat_age_s=round(now - heartbeat, 3))
        return snap


def is_loopback(host: str) -> bool:
    """Whether `host` only reaches this machine: localhost, 127.0.0.0/8, ::1 (and ::ffff:127.x)."""
    host = host.strip().strip("[]").lower().rstrip(".")
    if host == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False  # a host name: it may resolve anywhere
    mapped = getattr(addr, "ipv4_mapped", None)
    return addr.is_loopback or bool(mapped and mapped.is_loopback)


# --- the HTTP app -----------------------------------------------------------------------

def _json(body: dict, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(text=json.dumps(body, default=str), status=status,
                        content_type="application/json", headers=headers)


def _token_ok(request: web.Request, token: str) -> bool:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def _make_app(state: StatusState, token: str | None) -> web.Application:
    @web.middleware
    async def guard(request, handler):
        if token is not None and not _token_ok(request, token):
            return _json({"error": "missing or wrong bearer token"}, 401, {"WWW-Authenticate": "Bearer"})
        try:
            return await handler(request)
        except web.HTTPNotFound:
            return _json({"error": f"no endpoint {request.path}; try /healthz, /status, /recommendation or /metrics"}, 404)
        except web.HTTPMethodNotAllowed as exc:
            return _json({"error": f"{request.method} not allowed on {request.path}; use GET"}, 405,
                         {"Allow": ", ".join(sorted(exc.allowed_methods))})

    async def healthz(request):
        snap = state.snapshot()
        age = snap["heartbeat_age_s"]
        body = {"state": snap.get("state"), "heartbeat_age_s": age}
        if age > state.stale_after_s:
            return _json({"ok": False, "reason": f"driver loop silent for {int(age)} s", **body}, 503)
        return _json({"ok": True, **body})

    async def status(request):
        return _json(state.snapshot())

    async def metrics(request):
        return web.Response(body=prometheus_text(state.snapshot()).encode(),
                            headers={"Content-Type": CONTENT_TYPE})

    async def recommendation(request):
        snap = state.snapshot()
        if not snap.get("recommendation"):
            return _json({"error": "nothing published yet", "last_decision": snap.get("publish")}, 404)
        return _json(snap["recommendation"])

    app = web.Application(middlewares=[guard])
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/status", status)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/recommendation", recommendation)
    return app


# --- the server thread ------------------------------------------------------------------

def _bind(host: str, port: int) -> socket.socket:
    """A bound TCP socket for host:port; raises ConfigError naming host, port and the fix."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise ConfigError(f"status: host {host!r} does not resolve ({exc.strerror}); "
                          "pass --status-host with an address of this machine, e.g. 127.0.0.1") from exc
    sock = socket.socket(family, kind, proto)
    try:
        if os.name == "posix":  # as asyncio does: a restart can reuse a port left in TIME_WAIT
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"status: port {port} on {host} is in use (another daemon?); "
                              "pass --status-port with a free port or stop the other process") from exc
        if exc.errno == errno.EACCES:
            raise ConfigError(f"status: port {port} on {host} needs privileges; "
                              "pass --status-port above 1023") from exc
        raise ConfigError(f"status: cannot bind {host} port {port} ({exc.strerror or exc}); pass "
                          "--status-host with an address of this machine, e.g. 127.0.0.1") from exc
    return sock


class StatusServer:
    """The status API on host:port, served from a daemon thread; a context manager.

    Raises ConfigError (at construction) for a non-loopback host without a token or a bad
    port, and (from `start`) when the address cannot be bound."""

    def __init__(self, state: StatusState, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 token: str | None = None):
        token = (token or "").strip() or None
        if not is_loopback(host) and token is None:
            raise ConfigError(f"status: binding {host or 'every address'} exposes the daemon to the network; "
                              f"set {TOKEN_ENV} (or --status-token-file) or bind 127.0.0.1")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigError(f"status: port {port!r} is not a TCP port; "
                              "pass --status-port between 1 and 65535 (0 picks a free one)")
        self.state, self.host, self.token = state, host, token
        self._port = port
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._bound = 0

    @property
    def port(self) -> int:
        """The port bound by the last `start` (port=0 asks the OS for a free one), else the one asked for."""
        return self._bound or self._port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> StatusServer:
        """Bind, then serve from a daemon thread; returns once the socket is bound and listening."""
        if self._loop is not None:
            return self
        self._sock = _bind(self.host, self._port)
        self._bound = self._sock.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="optimizer-status", daemon=True)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(START_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise
        return self

    async def _serve(self) -> None:
        app = _make_app(self.state, self.token)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=STOP_TIMEOUT_S / 2)
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock).start()

    def stop(self) -> None:
        """Close the site and the loop (within ~2 s); safe to call twice or before start."""
        loop, thread, runner, sock = self._loop, self._thread, self._runner, self._sock
        self._loop = self._thread = self._runner = self._sock = None
        if loop is None:
            return
        deadline = time.monotonic() + STOP_TIMEOUT_S
        if runner is not None:
            try:
                asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(STOP_TIMEOUT_S * 0.75)
            except Exception:  # a slow client must not keep the daemon from exiting
                pass
        loop.call_soon_threadsafe(loop.stop)
        thread.join(max(0.1, deadline - time.monotonic()))
        if not thread.is_alive():
            loop.close()
        sock.close()

    def __enter__(self) -> StatusServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
