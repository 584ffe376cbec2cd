"""A stop names what it could not do instead of passing silently: a finished measurement that
could not be stored, a server that could not be reaped. It never waits on a Ray answer (the board
or a task starved of CPU held a stop up 33 s), finds a server the board never told of by its tag,
and lets an interrupt through."""

from __future__ import annotations

import socket
import threading
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
    """The run-state as a stop uses it: its server records, and this run's tagged groups."""

    path = SimpleNamespace(name="trials.db.runstate.json")

    def __init__(self, servers: dict[str, int], tagged: set[int] = frozenset()):
        self.records = {key: {"host": socket.gethostname(), "pgid": pgid} for key, pgid in servers.items()}
        self.tagged = set(tagged)

    def servers(self):
        return dict(self.records)

    def run_groups(self):
        return set(self.tagged)

    def remove_server(self, key):
        self.records.pop(key, None)


def running(number: int):
    return SimpleNamespace(ref=f"ref-{number}", trial=SimpleNamespace(number=number), key=f"s/{number}")


@pytest.fixture
def groups(monkeypatch):
    """Process groups as the stop sees them: `alive` holds each live group's pids; a SIGKILL
    (lifeline.stop_group) ends a group unless it is in `unkillable`. Nothing may ask Ray for an answer."""
    alive: dict[int, list[int]] = {}
    unkillable: set[int] = set()
    killed: list[int] = []

    def stop_group(pgid, grace):
        killed.append(pgid)
        if pgid not in unkillable:
            alive.pop(pgid, None)

    monkeypatch.setattr(poll, "group_pids", lambda pgid: list(alive.get(pgid, ())))
    monkeypatch.setattr(poll.lifeline, "stop_group", stop_group)
    monkeypatch.setattr(poll, "STOP_GRACE_S", 0.3)
    monkeypatch.setattr(ray, "wait", lambda refs, **kw: ([], list(refs)))
    monkeypatch.setattr(ray, "cancel", lambda ref, **kw: None)
    monkeypatch.setattr(ray, "get", lambda *a, **kw: pytest.fail("a stop must not wait on a Ray answer"))
    return SimpleNamespace(alive=alive, unkillable=unkillable, killed=killed)


def test_a_server_that_cannot_be_stopped_is_named_and_left_on_record(groups):
    groups.alive.update({111: [5], 222: [6]})
    groups.unkillable.add(111)
    notes, record = Notes(), Record({"s/1": 111, "s/2": 222})
    poll.stop_all([running(1), running(2)], None, board=None, runstate=record, progress=notes)
    assert groups.killed == [111, 222]
    assert len(notes.lines) == 1
    assert notes.lines[0].startswith("trial 1: its server could not be stopped (processes [5] still there")
    assert "trials.db.runstate.json" in notes.lines[0] and "the next start on this storage stops it" in notes.lines[0]
    assert set(record.records) == {"s/1"}  # kept for the next start; the other one was stopped and dropped


def test_a_server_the_board_never_told_of_is_found_by_its_tag_and_stopped(groups):
    groups.alive[333] = [7]
    notes, record = Notes(), Record({}, tagged={333})
    poll.stop_all([running(3)], None, board=None, runstate=record, progress=notes)
    assert groups.killed == [333] and notes.lines == []


def test_a_server_its_trial_stopped_within_the_grace_is_not_killed(groups):
    groups.alive[444] = [8]
    threading.Timer(0.05, groups.alive.pop, (444,)).start()  # the task's own stop
    poll.stop_all([running(4)], None, board=None, runstate=Record({"s/4": 444}), progress=Notes())
    assert groups.killed == []


def test_an_interrupt_during_a_stop_is_not_swallowed(groups, monkeypatch):
    def interrupted(pgid):
        raise KeyboardInterrupt

    monkeypatch.setattr(poll, "group_pids", interrupted)
    with pytest.raises(KeyboardInterrupt):
        poll.stop_all([running(1)], None, board=None, runstate=Record({"s/1": 111}), progress=Notes())


def test_cancel_waits_out_a_timeout_but_not_an_interrupt(monkeypatch):
    monkeypatch.setattr(ray, "wait", lambda refs, **kw: ([], list(refs)))
    monkeypatch.setattr(ray, "cancel", lambda ref, **kw: None)

    def timed_out(ref, timeout=None):
        raise ray.exceptions.GetTimeoutError("still running")

    monkeypatch.setattr(ray, "get", timed_out)
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
    notes, record = Notes(), Record({"s/3": 3, "s/4": 4})
    trials = study._Trials(None, None, None, notes, record, slots=2, running=[done, other])
    trials.stop(KeyboardInterrupt())
    assert notes.lines == ["trial 3: its measurement came back, but recording it failed (StorageError: storage "
                           "'sqlite:///trials.db' cannot be opened (OperationalError: disk I/O error)); if the study "
                           "did not get it, the trial stays RUNNING and the next start fails it as lost and queues "
                           "it again"]
    assert stopped == [other] and told == [4]  # the rest is still stopped and told interrupted
