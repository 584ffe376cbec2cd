"""The guard at the head of a server's process group (engine/lifeline.py), on real processes.

A stand-in "server" starts a grandchild in its group that ignores SIGTERM (as a vLLM
EngineCore busy starting up does) and then sleeps; nothing here needs vLLM.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from optimizer.engine import lifeline
from optimizer.engine.vllm import VllmServer, group_pids
from optimizer.testing import server_tree
from optimizer.testing.stand_in_server import write_stand_in

SERVER = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    subprocess.Popen([sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                      "open(sys.argv[1], 'w').close(); time.sleep(600)", sys.argv[1]])
    while not os.path.exists(sys.argv[1]):  # the grandchild ignores SIGTERM from here on
        time.sleep(0.02)
    code = int(sys.argv[2])
    time.sleep(600 if code < 0 else 0.5)
    sys.exit(code)
""")


def _ready(path, seconds=20.0) -> None:
    end = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < end:
        time.sleep(0.05)
    assert path.exists(), "the stand-in server never started its grandchild"


def _gone(pgid: int, seconds: float) -> float | None:
    """Seconds until the group is empty, or None if it is not within `seconds`."""
    return server_tree.gone_after(pgid, time.monotonic(), seconds)


def _guard(tmp_path, exit_code: int = -1):
    """(guard process, write end) around the stand-in server, as VllmServer starts it."""
    read_end, write_end = os.pipe()
    proc = subprocess.Popen([sys.executable, lifeline.__file__, str(read_end), "1.0", "--", sys.executable, "-c",
                             SERVER, str(tmp_path / "ready"), str(exit_code)], process_group=0,
                            pass_fds=(read_end,))
    os.close(read_end)
    return proc, write_end


def test_closing_the_owners_end_stops_the_whole_group(tmp_path):
    proc, write_end = _guard(tmp_path)
    _ready(tmp_path / "ready")
    assert len(group_pids(proc.pid)) == 4  # guard, its watcher, server, the grandchild that ignores SIGTERM
    os.close(write_end)  # what the kernel does when the owner dies
    took = _gone(proc.pid, 15)
    assert took is not None, group_pids(proc.pid)
    assert took >= 1.0  # the grandchild ignored SIGTERM: it went at SIGKILL, after the grace
    proc.wait(5)  # the guard went with its group (how it exited nobody reads: the owner is gone)


def test_the_servers_own_exit_code_comes_back_and_nothing_of_its_group_stays(tmp_path):
    proc, write_end = _guard(tmp_path, exit_code=3)
    try:
        _ready(tmp_path / "ready")
        assert proc.wait(20) == 3  # at once: the owner reads the server's status when it ends
        assert _gone(proc.pid, 15) is not None  # the grandchild the server left is stopped by the watcher
    finally:
        os.close(write_end)


def test_a_server_that_ends_whole_leaves_no_note_in_its_log(tmp_path):
    """The guard's end of the watcher's pipe closes a moment before the guard becomes a zombie; the
    watcher once counted the guard itself as left behind and wrote two notes after the server's
    last line, which the failure classifier then took as the crash's evidence (about 1 run in 3).
    Each round is one chance at that race."""
    for n in range(15):
        log = tmp_path / f"log{n}"
        read_end, write_end = os.pipe()
        try:
            with open(log, "wb") as f:  # as VllmServer gives it: stdout and stderr to the log file
                proc = subprocess.Popen([sys.executable, "-I", lifeline.__file__, str(read_end), "1.0", "--",
                                         "/bin/sh", "-c", "echo the server says why; exit 3"], stdout=f,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, process_group=0,
                                        pass_fds=(read_end,))
            os.close(read_end)
            assert proc.wait(20) == 3
            assert _gone(proc.pid, 15) is not None, group_pids(proc.pid)  # the watcher too: it wrote all it would
        finally:
            os.close(write_end)
        assert log.read_text() == "the server says why\n"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_guard_alone_reaches_the_server(tmp_path, sig):
    proc, write_end = _guard(tmp_path)
    try:
        _ready(tmp_path / "ready")
        proc.send_signal(sig)
        assert proc.wait(20) == -sig  # the server died of it, and the guard exits the same way
        assert _gone(proc.pid, 5) is not None
    finally:
        os.close(write_end)


def test_an_owner_gone_before_the_start_starts_nothing(tmp_path):
    read_end, write_end = os.pipe()
    os.close(write_end)
    proc = subprocess.Popen([sys.executable, lifeline.__file__, str(read_end), "1.0", "--", sys.executable, "-c",
                             SERVER, str(tmp_path / "ready"), "-1"], process_group=0, pass_fds=(read_end,),
                            stderr=subprocess.PIPE, text=True)
    os.close(read_end)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 1
    assert "the owner was gone before the server started; not starting it" in err
    assert not (tmp_path / "ready").exists()


OWNER = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from optimizer.engine.vllm import VllmServer
    server = VllmServer("m", [], Path(sys.argv[1]) / "log", python=sys.argv[2], startup_timeout=60)
    server.start()
    print(server.proc.pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no finally, no atexit: the owner dies as a killed Ray worker does
""")

def test_a_ready_server_dies_with_its_sigkilled_owner(tmp_path):
    exe = write_stand_in(tmp_path, stubborn_child=True)
    owner = subprocess.run([sys.executable, "-c", OWNER, str(tmp_path), str(exe)], capture_output=True, text=True,
                           timeout=90)
    assert owner.returncode == -signal.SIGKILL, owner.stderr[-2000:]
    pgid = int(owner.stdout.split()[0])
    took = _gone(pgid, lifeline.GRACE_S + 10)
    assert took is not None, f"left running: {group_pids(pgid)}"
    assert "the owner (pid" in (tmp_path / "log").read_text()


def test_a_stopped_server_closes_its_lifeline(tmp_path):
    exe = write_stand_in(tmp_path, stubborn_child=True)
    server = VllmServer("m", [], tmp_path / "log", python=str(exe), startup_timeout=30)
    before = _open_files()
    assert server.start()
    # The log file and the lifeline's write end. Compared by what each descriptor points at, not by
    # count: another test's thread may open or close a descriptor of its own meanwhile.
    ours = {str(tmp_path / "log"), f"pipe:[{os.fstat(server._lifeline).st_ino}]"}
    assert ours <= {target for fd, target in _open_files().items() if before.get(fd) != target}
    report = server.stop()
    assert report.leftover_pids == () and report.port_free
    assert not ours & set(_open_files().values())


def _open_files() -> dict[int, str]:
    """This process's descriptors and what each points at."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed meanwhile (listdir's own descriptor among them)
            pass
    return out


def test_a_sigkilled_guard_takes_its_server_with_it(tmp_path):
    """Ray SIGKILLs a worker's direct children when the worker exits after its driver died: that is
    the guard; the watcher (not the owner's child) stops the rest."""
    proc, write_end = _guard(tmp_path)
    try:
        _ready(tmp_path / "ready")
        proc.kill()
        assert proc.wait(5) == -signal.SIGKILL
        assert _gone(proc.pid, 15) is not None, group_pids(proc.pid)
    finally:
        os.close(write_end)


def test_a_stop_cut_short_still_lets_the_guard_stop_the_group(tmp_path, monkeypatch):
    from optimizer.engine import vllm

    exe = write_stand_in(tmp_path, stubborn_child=True)
    server = VllmServer("m", [], tmp_path / "log", python=str(exe), startup_timeout=30)
    assert server.start()

    def interrupted(*a, **kw):
        raise KeyboardInterrupt  # a second Ctrl-C, or Ray cancelling the task, mid-stop

    monkeypatch.setattr(vllm, "terminate_group", interrupted)
    with pytest.raises(KeyboardInterrupt):
        server.stop()
    assert _gone(server.proc.pid, lifeline.GRACE_S + 10) is not None, group_pids(server.proc.pid)
    server.proc.wait(5)
