"""A stop names what it could not do instead of passing silently: a finished measurement that
could not be stored, a server that could not be reaped. And its waits catch only what a wait
raises (Ray's errors, a timeout): a KeyboardInterrupt or SystemExit there is not swallowed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import ray

from optimizer.driver import poll, study
from optimizer.errors import StorageError


class Notes:
    def __init__(self):
        self.lines = []

    def note(self, text):
        self.lines.append(text)


class Record:
    """The run-state's server records, as the driver uses them."""

    path = SimpleNamespace(name="trials.db.runstate.json")

    def __init__(self, *keys):
        self.keys = set(keys)
        self.reaped = []

    def reap(self, key):
        self.reaped.append(key)

    def remove_server(self, key):
        self.keys.discard(key)


def running(number: int):
    return SimpleNamespace(ref=f"ref-{number}", trial=SimpleNamespace(number=number), key=f"s/{number}")


@pytest.fixture
def still_running(monkeypatch):
    """Every task still runs and never stops within the grace: each wait times out."""
    monkeypatch.setattr(ray, "wait", lambda refs, **kw: ([], list(refs)))
    monkeypatch.setattr(ray, "cancel", lambda ref, **kw: None)

    def timed_out(ref, timeout=None):
        raise ray.exceptions.GetTimeoutError("still running")

    monkeypatch.setattr(ray, "get", timed_out)


def test_a_server_that_cannot_be_reaped_is_named_and_left_on_record(monkeypatch, still_running):
    def board_gone(board, number, timeout):
        if number == 1:
            raise RuntimeError("the board actor died")
        return poll.REAPED

    monkeypatch.setattr(poll, "reap_server", board_gone)
    notes, record = Notes(), Record("s/1", "s/2")
    poll.stop_all([running(1), running(2)], None, board=None, runstate=record, progress=notes)
    assert len(notes.lines) == 1
    assert notes.lines[0].startswith("trial 1: its server could not be stopped (RuntimeError: the board actor died)")
    assert "trials.db.runstate.json" in notes.lines[0] and "the next start on this storage stops it" in notes.lines[0]
    assert record.keys == {"s/1"}  # kept for the next start; the other one was reaped and removed


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit])
def test_stop_all_does_not_swallow_an_interrupt(monkeypatch, still_running, raised):
    def interrupted(ref, timeout=None):
        raise raised()

    monkeypatch.setattr(ray, "get", interrupted)
    with pytest.raises(raised):
        poll.stop_all([running(1)], None, board=None, runstate=Record("s/1"), progress=Notes())


def test_cancel_waits_out_a_timeout_but_not_an_interrupt(monkeypatch, still_running):
    plan = SimpleNamespace(cfg=SimpleNamespace(engine=SimpleNamespace(shutdown_timeout_s=1)))
    poll.cancel("ref-1", plan, grace=0.1)  # a timeout: the caller reaps the server next

    def interrupted(ref, timeout=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(ray, "get", interrupted)
    with pytest.raises(KeyboardInterrupt):
        poll.cancel("ref-1", plan, grace=0.1)


def test_a_finished_measurement_that_cannot_be_stored_during_a_stop_is_named(monkeypatch):
    done, other = running(3), running(4)
    monkeypatch.setattr(ray, "wait", lambda refs, timeout=0: ([r for r in refs if r == done.ref], []))
    monkeypatch.setattr(ray, "get", lambda ref: "result of trial 3")

    def database_gone(*args):
        raise StorageError("storage 'sqlite:///trials.db' cannot be opened (OperationalError: disk I/O error)")

    stopped, told = [], []
    monkeypatch.setattr(study, "finish", database_gone)
    monkeypatch.setattr(study, "stop_all", lambda rest, plan, board, runstate, progress: stopped.extend(rest))
    monkeypatch.setattr(study.outcome, "tell_infra", lambda s, trial, remedy, evidence: told.append(trial.number))
    monkeypatch.setattr(study, "queue_again", lambda s, trial, always, reason: None)
    notes, record = Notes(), Record("s/3", "s/4")
    trials = study._Trials(None, None, None, notes, record, slots=2, running=[done, other])
    trials.stop(KeyboardInterrupt())
    assert notes.lines == ["trial 3: its measurement came back, but recording it failed (StorageError: storage "
                           "'sqlite:///trials.db' cannot be opened (OperationalError: disk I/O error)); if the study "
                           "did not get it, the trial stays RUNNING and the next start fails it as lost and queues "
                           "it again"]
    assert stopped == [other] and told == [4]  # the rest is still stopped and told interrupted
