"""daemon/generation_watch.py: the live source is read while a generation tunes; a change is said
at once, and `daemon.on_change` decides whether the generation ends (shutdown.Handoff)."""

import time
from dataclasses import replace

import pytest

from optimizer import shutdown
from optimizer.daemon.generation_watch import GenerationWatch
from optimizer.workload import drift
from tests.unit.daemon.test_observing import daemon, window


def watched(tmp_path, script, on_change):
    d, out = daemon(tmp_path, script)
    watch = GenerationWatch(d.observer, drift.shape_of_window(window(1)), 0.25, 0.01, on_change, d.console, 3)
    return d, out, watch


def run_until(predicate, seconds=3.0):
    end = time.monotonic() + seconds
    while not predicate() and time.monotonic() < end:
        time.sleep(0.01)


@pytest.mark.parametrize("on_change, saturated, ends", [
    ("auto", False, False), ("auto", True, True), ("wait", True, False), ("abort", False, True)])
def test_a_change_during_a_generation_is_said_at_once_and_on_change_decides(tmp_path, on_change, saturated, ends):
    new = replace(window(4), backlog_growth=30.0) if saturated else window(4)
    d, out, watch = watched(tmp_path, lambda n: window(1) if n < 3 else new, on_change)
    checks = []
    try:
        with watch:
            run_until(lambda: watch.seen is not None)
            time.sleep(0.1)
            checks.append(d.state.snapshot()["watch"]["last_check"])
            time.sleep(0.1)
            checks.append(d.state.snapshot()["watch"]["last_check"])
            handed = shutdown.handoff.is_set()
    finally:
        shutdown.handoff.clear()
    assert checks[1] > checks[0]  # reads go on while the generation runs: /status is live
    assert watch.seen is not None and d.state.snapshot()["watch"]["last_change"] == watch.seen
    text = out.getvalue()
    assert text.count("traffic changed during generation 3 (input p10") == 1
    assert handed is ends and watch.aborted is ends
    assert ("ending it now" in text) is ends and f"(daemon.on_change {on_change})" in text
    assert not shutdown.handoff.is_set()  # leaving the watch clears the request


def test_the_driver_s_loops_end_the_generation_on_a_handoff_not_a_stop():
    shutdown.handoff.set()
    try:
        with pytest.raises(shutdown.Handoff):
            shutdown.check()
        assert issubclass(shutdown.Handoff, KeyboardInterrupt)  # stopped and queued again like a stop
    finally:
        shutdown.handoff.clear()
    shutdown.check()  # nothing pending: no exception


def test_a_change_that_does_not_last_is_forgotten(tmp_path):
    d, out, watch = watched(tmp_path, lambda n: window(4) if n == 2 else window(1), "wait")
    with watch:
        run_until(lambda: "did not last" in out.getvalue())
    assert watch.seen is None and "the change did not last" in out.getvalue()


def test_reads_during_a_generation_do_not_make_a_stuck_driver_look_alive(tmp_path):
    d, out, watch = watched(tmp_path, lambda n: window(1), "wait")
    d.state.set(state="tuning")
    with watch:
        time.sleep(0.6)  # the thread reads every 0.01 s meanwhile
        age = d.state.heartbeat_age()
        checked = d.state.snapshot()["watch"]["last_check"]
    assert age >= 0.5 and checked is not None  # /status is live, the heartbeat is the driver's alone
    assert d.observer.beats


def test_auto_does_not_end_a_generation_for_load_alone_or_when_it_was_tuned_on_saturated_traffic(tmp_path):
    """A trial slowing production (only the requests in flight moved, saturated) and a generation
    already tuned on an overload (its window saturated too) both wait; a real change would not."""
    from optimizer.workload.drift import Shape
    base = drift.shape_of_window(window(1))
    loaded = replace(window(1, requests=10.0), backlog_growth=30.0, concurrency=20.0)  # the same 40 arrivals
    d, out, watch = watched(tmp_path, lambda n: loaded, "auto")
    watch.shape = replace(base, concurrency=3.0)
    with watch:
        run_until(lambda: watch.seen is not None)
        time.sleep(0.1)
    assert "in flight" in " ".join(watch.moved) and all(m.startswith("in flight") for m in watch.moved)
    assert not watch.aborted and "it goes on" in out.getvalue()
    d2, out2, again = watched(tmp_path, lambda n: replace(window(4), backlog_growth=30.0), "auto")
    again.tuned_saturated = True
    with again:
        run_until(lambda: again.seen is not None)
        time.sleep(0.1)
    assert not again.aborted and not shutdown.handoff.is_set()
    assert isinstance(base, Shape)


def test_the_change_that_started_a_generation_is_not_news_during_it(tmp_path):
    d, out, watch = watched(tmp_path, lambda n: window(1), "wait")
    d.observer.watch["last_change"] = 123.0  # set by the watch that started this generation
    d.state.set(watch=d.observer.watch)
    with watch:
        assert d.state.snapshot()["watch"]["last_change"] is None  # at once, not at the first read
    assert d.observer.watch["last_change"] is None
