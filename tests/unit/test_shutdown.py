"""Stop signals, in a child process (the test runner's own handlers stay untouched): the first
signal stops the driver (at once, or at the next poll inside `polling()`), later ones are only
reported, and `shutdown.sleep` ends early."""

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRELUDE = textwrap.dedent("""
    import os, signal, sys, time
    from optimizer import shutdown
    shutdown.install()
    def me(sig=signal.SIGTERM):
        os.kill(os.getpid(), sig)
        time.sleep(0.01)  # the handler has run by now
""")


def _start(body: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def _run(body: str, timeout: float = 5) -> tuple[int, list[str], str]:
    p = _start(body)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        return -1, out.splitlines() + ["(hung)"], err
    return p.returncode, out.splitlines(), err


def _signal_when_ready(p: subprocess.Popen, sig: int) -> float:
    assert p.stdout.readline().strip() == "ready"
    time.sleep(0.1)  # inside the sleep by now
    p.send_signal(sig)
    return time.monotonic()


def test_a_signal_outside_polling_raises_at_once():
    p = _start("""
        print("ready", flush=True)
        t0 = time.monotonic()
        try:
            time.sleep(30)
        except KeyboardInterrupt:
            print("interrupted", shutdown.requested.is_set(), flush=True)
    """)
    sent = _signal_when_ready(p, signal.SIGTERM)
    out, err = p.communicate(timeout=5)
    assert time.monotonic() - sent < 2
    assert (p.returncode, out.split(), err) == (0, ["interrupted", "True"], "")


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_inside_polling_a_signal_only_sets_the_flag_and_check_raises(sig):
    rc, out, err = _run(f"""
        try:
            with shutdown.polling():
                me(signal.{sig})
                print("flag", shutdown.requested.is_set(), flush=True)
                shutdown.check()
                print("not reached", flush=True)
        except KeyboardInterrupt:
            print("check raised", flush=True)
        try:
            with shutdown.polling():  # a loop entered after the stop was asked for does not start
                print("not reached", flush=True)
        except KeyboardInterrupt:
            print("entry raised", flush=True)
    """)
    assert (rc, out, err) == (0, ["flag True", "check raised", "entry raised"], "")


def test_a_second_signal_while_stopping_is_only_reported():
    rc, out, err = _run("""
        try:
            me()
            print("not reached", flush=True)
        except KeyboardInterrupt:
            print("first raised", flush=True)
        # the clean-up runs now; a second Ctrl-C (outside polling, too) must not break it
        me(signal.SIGINT)
        me(signal.SIGHUP)
        print("clean-up finished", flush=True)
    """)
    assert (rc, out) == (0, ["first raised", "clean-up finished"])
    assert err.splitlines() == [
        "already stopping (SIGINT ignored): the running trial's server is being stopped",
        "already stopping (SIGHUP ignored): the running trial's server is being stopped",
    ]


def test_sigint_is_caught_even_when_started_with_it_ignored():
    """`cmd &` in a non-interactive shell starts with SIGINT ignored; install() routes it anyway."""
    p = _start("""
        print("ready", flush=True)
        try:
            time.sleep(30)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    """, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    _signal_when_ready(p, signal.SIGINT)
    out, _ = p.communicate(timeout=5)
    assert (p.returncode, out.split()) == (0, ["interrupted"])


def test_sleep_ends_within_a_second_of_a_signal():
    p = _start("""
        print("ready", flush=True)
        t0 = time.monotonic()
        try:
            shutdown.sleep(30)
            print("slept through", flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    """)
    sent = _signal_when_ready(p, signal.SIGTERM)
    out, err = p.communicate(timeout=5)
    assert time.monotonic() - sent < 1.0
    assert (p.returncode, out.split(), err) == (0, ["interrupted"], "")


def test_sleep_without_a_signal_sleeps_and_returns():
    rc, out, err = _run("""
        t0 = time.monotonic()
        shutdown.sleep(0.2)
        print(round(time.monotonic() - t0, 1), shutdown.requested.is_set(), flush=True)
    """)
    assert (rc, out, err) == (0, ["0.2 False"], "")


def test_installing_again_after_ray_keeps_a_stop_already_asked_for():
    rc, out, err = _run("""
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(1))  # as ray.init does
        with shutdown.polling():
            shutdown.install(clear=False)
            me()
            shutdown.install(clear=False)
            print(shutdown.requested.is_set(), flush=True)
        shutdown.install()
        print(shutdown.requested.is_set(), flush=True)
    """)
    assert (rc, out, err) == (0, ["True", "False"], "")


def test_a_first_signal_inside_a_deferred_stop_waits_for_the_next_check():
    """`regress` stops its server in a deferred region: a first Ctrl-C there must not cut the stop
    (and its escalation to SIGKILL) short; the loop's next check acts on it."""
    rc, out, err = _run("""
        with shutdown.deferred():
            me(signal.SIGINT)
            print("stop finished", shutdown.requested.is_set(), flush=True)
        try:
            shutdown.check()
            print("not reached", flush=True)
        except KeyboardInterrupt:
            print("check raised", flush=True)
    """)
    assert (rc, out, err) == (0, ["stop finished True", "check raised"], "")
