"""The run-state file: one driver per storage, and what a dead driver left running is reaped,
with real processes (a second driver in its own process, tagged "servers", a SIGKILLed holder)."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from optimizer.driver.store.driver_lock import (
    RUN_TAG,
    STORAGE_TAG,
    RunState,
    paths_for,
    storage_digest,
)
from optimizer.engine.vllm import group_pids
from optimizer.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]
SLEEP = "import time; time.sleep(600)"
# A server whose engine lives on in a child of the same group (like vLLM's EngineCore).
WITH_CHILD = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
              "time.sleep(600)")
HOLDER = ("import sys, time\nfrom optimizer.driver.store.driver_lock import RunState\n"
          "RunState(sys.argv[1], sys.argv[2]).acquire()\nprint('held', flush=True)\ntime.sleep(600)\n")


@pytest.fixture
def url(tmp_path):
    return f"sqlite:///{tmp_path / 'trials.db'}"


@pytest.fixture
def spawned():
    """Processes a test started; whatever is still alive at the end is killed (group and all)."""
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        for pid in group_pids(p.pid):
            _kill(pid)
        _kill(p.pid)
        p.wait(timeout=5)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _spawn(procs, code: str = SLEEP, tags: dict | None = None, session: bool = True) -> subprocess.Popen:
    env = {**os.environ, **(tags or {})}
    p = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=session)
    procs.append(p)
    return p


def _server(procs, digest: str, code: str = SLEEP) -> subprocess.Popen:
    p = _spawn(procs, code, {STORAGE_TAG: digest, RUN_TAG: "dead-run"})
    if code == WITH_CHILD:
        _until(lambda: len(group_pids(p.pid)) == 2)
    return p


def _until(cond, seconds: float = 5.0) -> None:
    end = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _dead_run(path: Path, servers: dict | None = None, ray: list | None = None, pid: int = 4_000_000) -> dict:
    """A run-state file as a driver that was SIGKILLed leaves it (its pid no longer running)."""
    record = {"driver": {"pid": pid, "create_time": 1.0, "host": socket.gethostname(), "run_id": "dead-run",
                         "started_at": 1.0},
              "ray_processes": ray or [], "servers": servers or {}}
    path.write_text(json.dumps(record))
    return record


def _entry(pgid: int, host: str | None = None) -> dict:
    return {"host": host or socket.gethostname(), "pgid": pgid, "study": "s", "trial": 1}


# --- one driver per storage ----------------------------------------------------------------------
def test_acquire_on_fresh_storage_writes_the_driver_and_release_removes_it(url, tmp_path):
    rs = RunState(url, tmp_path / "artifacts")
    assert (rs.lock_path, rs.path) == (tmp_path / "trials.db.lock", tmp_path / "trials.db.runstate.json")
    recovery = rs.acquire()
    assert not recovery and recovery.previous is None
    assert rs.lock_path.exists()
    driver = json.loads(rs.path.read_text())["driver"]
    assert driver["pid"] == os.getpid() and driver["host"] == socket.gethostname()
    assert driver["run_id"] == rs.run_id
    rs.release()
    assert not rs.path.exists()
    rs.release()  # twice is harmless
    with RunState(url, tmp_path / "artifacts") as again:  # and the storage is free for the next one
        assert not again.acquire()
    assert not again.path.exists()


def test_non_sqlite_storage_keeps_its_files_in_the_artifacts_dir(tmp_path):
    pg = "postgresql://u:p@h/db"
    lock, state = paths_for(pg, tmp_path / "artifacts")
    base = f"storage-{storage_digest(pg)}"
    assert lock == tmp_path / "artifacts" / f"{base}.lock"
    assert state == tmp_path / "artifacts" / f"{base}.runstate.json"
    with RunState(pg, tmp_path / "artifacts") as rs:  # no database is touched: the dir is made
        rs.acquire()
        assert state.exists() and lock.exists()
    assert not state.exists()


def test_a_second_driver_in_this_process_is_refused_with_the_holders_pid(url, tmp_path):
    with RunState(url, tmp_path) as first:
        first.acquire()
        with pytest.raises(ConfigError, match=rf"in use by another driver \(pid {os.getpid()} on "):
            RunState(url, tmp_path).acquire()
        assert json.loads(first.path.read_text())["driver"]["pid"] == os.getpid()  # the refused one wrote nothing


def test_a_driver_in_another_process_holds_the_storage_until_it_is_killed(url, tmp_path, spawned):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, url, str(tmp_path)], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    spawned.append(holder)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(ConfigError, match=rf"pid {holder.pid} on {socket.gethostname()}"):
        RunState(url, tmp_path).acquire()
    holder.send_signal(signal.SIGKILL)  # no clean-up runs: the lock goes with the process, the file stays
    holder.wait(timeout=5)
    with RunState(url, tmp_path) as rs:
        recovery = rs.acquire()
        assert recovery and recovery.previous["pid"] == holder.pid
        assert rs.previous == recovery.previous
        assert json.loads(rs.path.read_text())["driver"]["pid"] == os.getpid()


# --- what a dead driver left ---------------------------------------------------------------------
def test_a_dead_drivers_servers_are_killed_recorded_or_only_tagged(url, tmp_path, spawned):
    digest = storage_digest(url)
    recorded = _server(spawned, digest)
    unrecorded = _server(spawned, digest)  # started in the last moment before the crash: only its env says so
    grouped = _server(spawned, digest, WITH_CHILD)
    child = next(pid for pid in group_pids(grouped.pid) if pid != grouped.pid)
    rs = RunState(url, tmp_path)
    _dead_run(rs.path, {"s/1": _entry(recorded.pid), "s/2": _entry(grouped.pid)})
    with rs:
        recovery = rs.acquire()
    assert sorted(recovery.servers_killed) == sorted([recorded.pid, unrecorded.pid, grouped.pid])
    assert recovery.previous["run_id"] == "dead-run"
    for p in (recorded, unrecorded, grouped):
        assert p.wait(timeout=5) is not None
    _until(lambda: _gone(child))
    assert group_pids(grouped.pid) == []


def test_recorded_servers_already_gone_are_said_to_have_stopped_with_their_workers(url, tmp_path, spawned):
    gone = _server(spawned, storage_digest(url))
    gone.kill()  # as its guard does when its Ray worker dies
    gone.wait(timeout=5)
    rs = RunState(url, tmp_path)
    _dead_run(rs.path, {"s/1": _entry(gone.pid), "s/2": _entry(4_000_001, host="elsewhere")})
    with rs:
        recovery = rs.acquire()
    assert recovery.servers_killed == []
    assert "the vLLM server(s) of s/1 had already stopped with their Ray workers: nothing left to reap" in recovery.notes
    assert any(n.startswith("server of s/2 on elsewhere") and "its guard stops it" in n for n in recovery.notes)


def test_a_group_whose_leader_died_is_still_found_by_its_tagged_child(url, tmp_path, spawned):
    digest = storage_digest(url)
    grouped = _server(spawned, digest, WITH_CHILD)
    child = next(pid for pid in group_pids(grouped.pid) if pid != grouped.pid)
    grouped.kill()  # the API server died; its engine process did not
    grouped.wait(timeout=5)
    assert group_pids(grouped.pid) == [child]
    rs = RunState(url, tmp_path)
    _dead_run(rs.path, {"s/1": _entry(grouped.pid)})
    with rs:
        assert rs.acquire().servers_killed == [grouped.pid]
    _until(lambda: _gone(child))


def test_groups_not_tagged_with_this_storage_are_left_alone_even_if_the_file_names_them(url, tmp_path, spawned):
    """A pid the dead run-state names may since belong to anything: only a group whose leader
    carries this storage's tag is ever signalled."""
    untagged = _spawn(spawned)
    other = _spawn(spawned, tags={STORAGE_TAG: storage_digest("sqlite:////elsewhere/trials.db"), RUN_TAG: "r"})
    elsewhere = _server(spawned, storage_digest(url))  # tagged, but the file says it runs on another host
    rs = RunState(url, tmp_path)
    _dead_run(rs.path, {"s/1": _entry(untagged.pid), "s/2": _entry(other.pid),
                        "s/3": _entry(elsewhere.pid, host="another-node")})
    with rs:
        recovery = rs.acquire()
    assert recovery.servers_killed == [elsewhere.pid]  # the env scan still finds it on this host
    assert any("another-node" in n and "not reaped" in n for n in recovery.notes)
    time.sleep(0.2)
    assert untagged.poll() is None and other.poll() is None


def test_a_dead_drivers_ray_processes_are_killed_but_not_a_reused_pid(url, tmp_path, spawned):
    ray_proc = _spawn(spawned, session=False)
    reused = _spawn(spawned, session=False)
    key = {"pid": ray_proc.pid, "create_time": psutil.Process(ray_proc.pid).create_time()}
    stale = {"pid": reused.pid, "create_time": psutil.Process(reused.pid).create_time() - 100}  # another process's
    rs = RunState(url, tmp_path)
    _dead_run(rs.path, ray=[key, stale, {"pid": 4_000_001, "create_time": 1.0}])
    with rs:
        recovery = rs.acquire()
    assert recovery.ray_killed == 1
    assert ray_proc.wait(timeout=5) == -signal.SIGKILL
    assert reused.poll() is None


def test_a_garbage_run_state_is_noted_and_the_scan_still_reaps(url, tmp_path, spawned):
    leftover = _server(spawned, storage_digest(url))
    rs = RunState(url, tmp_path)
    rs.path.write_text("{\"driver\": {\"pid\": 12")  # torn: not the atomic writer's doing, but a disk can
    with rs:
        recovery = rs.acquire()
        assert recovery.previous is None
        assert any("unreadable" in n and str(rs.path) in n for n in recovery.notes)
        assert recovery.servers_killed == [leftover.pid]
        assert json.loads(rs.path.read_text())["driver"]["pid"] == os.getpid()  # replaced by a good one
    assert leftover.wait(timeout=5) is not None


def test_servers_are_recorded_atomically_and_the_file_always_parses(url, tmp_path):
    rs = RunState(url, tmp_path)
    rs.acquire()
    seen, bad, done = [0], [], threading.Event()

    def read():
        while not done.is_set():
            try:
                json.loads(rs.path.read_text())
                seen[0] += 1
            except (ValueError, OSError) as exc:
                bad.append(repr(exc))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(100):
            rs.add_server(f"s/{i}", "h", 1000 + i, "s", i)
            if i % 2:
                rs.remove_server(f"s/{i - 1}")
    finally:
        done.set()
        reader.join()
    assert bad == [] and seen[0] > 0
    on_disk = json.loads(rs.path.read_text())["servers"]
    assert on_disk == rs.servers() and len(on_disk) == 50
    assert on_disk["s/99"] == {"host": "h", "pgid": 1099, "study": "s", "trial": 99}
    mtime = rs.path.stat().st_mtime_ns
    rs.remove_server("never-added")  # nothing to forget: no rewrite
    assert rs.path.stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    rs.release()


def test_a_server_whose_driver_still_runs_is_never_killed(url, tmp_path, spawned):
    """A live driver on the same storage that this lock does not see (another artifacts dir on a
    database server): its server is left alone; once that driver is gone, it is reaped."""
    digest = storage_digest(url)
    driver = _spawn(spawned, session=True)
    server = _spawn(spawned, tags={STORAGE_TAG: digest, RUN_TAG: f"{socket.gethostname()}:{driver.pid}:1.0"})
    rs = RunState(url, tmp_path / "artifacts")
    assert rs.acquire().servers_killed == []
    rs.release()
    assert not _gone(server.pid)
    _kill(driver.pid)
    driver.wait(timeout=5)
    rs = RunState(url, tmp_path / "artifacts")
    assert rs.acquire().servers_killed == [server.pid]
    rs.release()
    _until(lambda: _gone(server.pid))


def test_this_runs_servers_are_found_by_their_tag_and_no_others(url, tmp_path, spawned):
    """What a stop uses to find its servers without asking Ray (driver/poll.py stop_tasks)."""
    rs = RunState(url, tmp_path / "artifacts")
    rs.acquire()
    try:
        mine = _spawn(spawned, tags=rs.server_env())
        other = _spawn(spawned, tags={STORAGE_TAG: rs.digest, RUN_TAG: "another-run"})
        untagged = _spawn(spawned)
        _until(lambda: mine.pid in rs.run_groups())
        found = rs.run_groups()
        assert mine.pid in found and other.pid not in found and untagged.pid not in found
    finally:
        rs.release()
