"""terminate_group: the whole process group goes, including a child that ignores SIGTERM."""

import subprocess
import sys
import textwrap

from optimizer.engine.vllm import group_pids, terminate_group

STUBBORN = textwrap.dedent("""
    import signal, subprocess, sys, time
    # a grandchild that ignores SIGTERM, like a stuck engine worker; it says so by creating READY
    subprocess.Popen([sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                      "open(sys.argv[1], 'w').close(); time.sleep(600)", sys.argv[1]])
    time.sleep(600)
""")


def _spawn(code: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    for _ in range(50):
        if len(group_pids(proc.pid)) >= 2:
            break
        subprocess.run(["sleep", "0.1"])
    return proc


def test_sigterm_is_enough_for_a_cooperative_group():
    proc = _spawn("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)")
    assert len(group_pids(proc.pid)) == 2
    killed, leftovers = terminate_group(proc.pid, timeout=5, leader=proc)
    assert (killed, leftovers) == (False, ())
    assert proc.poll() is not None


def test_a_grandchild_ignoring_sigterm_is_killed(tmp_path):
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN, str(ready)], start_new_session=True)
    for _ in range(100):  # under load the grandchild may take a while to start ignoring SIGTERM
        if ready.exists():
            break
        subprocess.run(["sleep", "0.1"])
    assert ready.exists() and len(group_pids(proc.pid)) == 2
    killed, leftovers = terminate_group(proc.pid, timeout=1, leader=proc)
    assert killed is True and leftovers == ()
