"""driver/ray_runtime.py: a stop signal while Ray starts is acted on once Ray is up (ray.init runs on
a thread of its own, so neither Ray's SIGTERM handler nor its native one cuts it short), and
whatever the embedded Ray started and left running is killed when it is shut down."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from optimizer import shutdown
from optimizer.driver import ray_runtime


@pytest.fixture
def our_handlers():
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    shutdown.install()
    yield
    shutdown.requested.clear()
    for s, handler in previous.items():
        signal.signal(s, handler)


def test_a_sigterm_while_ray_starts_lets_it_start_then_stops(monkeypatch, our_handlers):
    started, stopped, body = [], [], []

    def init(**kwargs):
        assert threading.current_thread() is not threading.main_thread()
        time.sleep(0.5)  # the signal lands meanwhile
        started.append(True)

    monkeypatch.setattr(ray_runtime.ray, "init", init)
    monkeypatch.setattr(ray_runtime.ray, "shutdown", lambda: stopped.append(True))
    threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM)).start()
    with pytest.raises(KeyboardInterrupt):
        with ray_runtime.ray_runtime(None):
            body.append(True)
    assert started == [True] and stopped == [True] and body == []
    assert shutdown.requested.is_set()
    assert signal.getsignal(signal.SIGTERM) is shutdown._on_signal


def test_a_start_slow_to_come_up_is_abandoned_and_what_it_started_killed(monkeypatch, our_handlers):
    """A stop while Ray is still starting its processes (10-20 s on a loaded machine) waits
    INIT_STOP_WAIT_S, then kills what the start began instead of asking Ray to stop it."""
    started, unhooked = [], []

    def init(**kwargs):  # Ray starting its processes, and slow to come up
        started.append(_sleeper())
        time.sleep(30)

    monkeypatch.setattr(ray_runtime.ray, "init", init)
    monkeypatch.setattr(ray_runtime.ray, "shutdown", lambda: pytest.fail("Ray is still starting: not to be asked"))
    monkeypatch.setattr(ray_runtime, "INIT_STOP_WAIT_S", 0.5)
    monkeypatch.setattr(ray_runtime.atexit, "unregister", unhooked.append)
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
    t = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            with ray_runtime.ray_runtime(None):
                pass
        assert time.monotonic() - t < 10  # not the 30 s start
        started[0].wait(timeout=5)  # killed, not its 60 s sleep
        assert unhooked == [ray_runtime.ray._private.worker.shutdown]  # Ray's exit hook would wait on the start
    finally:
        for p in started:
            p.kill()
            p.wait()


def test_any_other_exit_inside_ray_init_is_left_alone(monkeypatch):
    monkeypatch.setattr(ray_runtime.ray, "init", lambda **kw: (_ for _ in ()).throw(SystemExit(3)))
    monkeypatch.setattr(ray_runtime.ray, "shutdown", lambda: None)
    with pytest.raises(SystemExit) as exc:
        with ray_runtime.ray_runtime(None):
            pass
    assert exc.value.code == 3


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_what_ray_left_running_is_killed_and_nothing_else(monkeypatch):
    """A child started while Ray ran (as Ray's agents are, which outlive a Ray shut down early) is
    killed after ray.shutdown; a child the driver had before Ray is not touched."""
    before = _sleeper()
    during = []
    monkeypatch.setattr(ray_runtime.ray, "init", lambda **kw: during.append(_sleeper()))
    monkeypatch.setattr(ray_runtime.ray, "shutdown", lambda: None)
    try:
        with ray_runtime.ray_runtime(None):
            assert during[0].poll() is None
        during[0].wait(timeout=5)  # killed (reaped by the kill's wait), not its 60 s sleep
        assert before.poll() is None and psutil.Process(before.pid).status() != psutil.STATUS_ZOMBIE
    finally:
        for p in [before, *during]:
            p.kill()
            p.wait()


def test_a_ray_that_did_not_start_is_one_line_and_cleaned_up(monkeypatch):
    stopped = []

    def init(**kwargs):
        raise RuntimeError("The current node timed out during startup.\nmore")

    monkeypatch.setattr(ray_runtime.ray, "init", init)
    monkeypatch.setattr(ray_runtime.ray, "shutdown", lambda: stopped.append(True))
    monkeypatch.setattr(ray_runtime.time, "sleep", lambda s: None)
    with pytest.raises(ray_runtime.RayUnavailable, match="did not start .The current node timed out during startup.."):
        with ray_runtime.ray_runtime(None):
            pass
    assert stopped  # every failed start was shut down


def test_a_board_read_gives_up_at_once_when_a_stop_is_asked_for(monkeypatch):
    """A board that does not answer (an actor starved of CPU) held a stop up 10 s a read."""
    waited = []
    monkeypatch.setattr(ray_runtime.ray, "wait", lambda refs, timeout: waited.append(timeout) or ([], refs))
    with pytest.raises(ray_runtime.ray.exceptions.GetTimeoutError):
        ray_runtime.board_get("ref", timeout=0.3)  # no stop: waits out its timeout, in short steps
    assert len(waited) >= 3 and max(waited) <= 0.1
    waited.clear()
    shutdown.requested.set()
    try:
        with pytest.raises(ray_runtime.ray.exceptions.GetTimeoutError, match="a stop was asked for"):
            ray_runtime.board_get("ref", timeout=60)
        assert len(waited) == 1
    finally:
        shutdown.requested.clear()


STOP_AFTER_RAY = """
import ctypes, os, signal, sys
from optimizer import shutdown
from optimizer.driver import ray_runtime
libc = ctypes.CDLL(None)
ray_runtime.ray.init = lambda **kw: None
# Ray's native shut-down resets SIGTERM to the default action behind Python's back (Ray 2.60)
ray_runtime.ray.shutdown = lambda: libc.signal(signal.SIGTERM, ctypes.c_void_p(0))
shutdown.install()
with ray_runtime.ray_runtime(None):
    pass
try:
    os.kill(os.getpid(), signal.SIGTERM)
    shutdown.sleep(5)
except KeyboardInterrupt:
    print("stopped")
"""


def test_a_sigterm_after_ray_is_shut_down_is_still_a_stop():
    """Not the default action (exit -15): the daemon watches, or starts its next generation, after
    a generation's Ray was shut down."""
    done = subprocess.run([sys.executable, "-c", STOP_AFTER_RAY], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[3])
    assert (done.returncode, done.stdout.strip()) == (0, "stopped"), done.stderr[-2000:]
