"""driver/ray_runtime.py: a stop signal that lands inside ray.init, where Ray's own SIGTERM handler
turns it into sys.exit(15), stops the run like any other stop (KeyboardInterrupt), not exit 15."""

import signal

import pytest

from optimizer import shutdown
from optimizer.driver import ray_runtime


def test_a_sigterm_inside_ray_init_is_a_stop_not_exit_15(monkeypatch):
    stopped = []

    def init(**kwargs):
        signal.signal(signal.SIGTERM, lambda signum, frame: (_ for _ in ()).throw(SystemExit(signum)))  # Ray's way
        raise SystemExit(signal.SIGTERM)  # the signal arrived while Ray started

    monkeypatch.setattr(ray_runtime.ray, "init", init)
    monkeypatch.setattr(ray_runtime.ray, "shutdown", lambda: stopped.append(True))
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        with pytest.raises(KeyboardInterrupt):
            with ray_runtime.ray_runtime(None):
                pass
        assert shutdown.requested.is_set() and stopped == [True]
        assert signal.getsignal(signal.SIGTERM) is shutdown._on_signal  # taken back from "Ray"
    finally:
        shutdown.requested.clear()
        for s, handler in previous.items():
            signal.signal(s, handler)


def test_any_other_exit_inside_ray_init_is_left_alone(monkeypatch):
    monkeypatch.setattr(ray_runtime.ray, "init", lambda **kw: (_ for _ in ()).throw(SystemExit(3)))
    with pytest.raises(SystemExit) as exc:
        with ray_runtime.ray_runtime(None):
            pass
    assert exc.value.code == 3
