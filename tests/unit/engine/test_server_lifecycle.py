"""VllmServer: one process group per server, started once, stopped completely.

A stand-in for `python -m vllm.entrypoints.openai.api_server` (an executable given as
`python=`) answers /health and /v1/models on the port it is handed, so the lifecycle runs
in a second without vLLM.
"""


import os

import psutil

from optimizer.engine.vllm import VllmServer
from optimizer.testing.stand_in_server import write_stand_in


def stand_in(tmp_path):
    return write_stand_in(tmp_path)


def test_start_inside_with_launches_one_server_only(tmp_path):
    first_arg = stand_in(tmp_path)  # the stand-in runs as `python <its path> ...`
    with VllmServer("m", [], tmp_path / "log", python=first_arg, startup_timeout=20) as srv:
        assert srv.state == "ready"
        first = srv.proc.pid
        assert srv.start() is True  # the old trap: a second start() orphaned the first server
        assert srv.proc.pid == first
        servers = [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or ["", ""])[1:2] == [first_arg]]
        assert len(servers) == 1 and servers[0].parent().pid == first  # one server, under its guard
    assert not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE
    report = srv.stop()  # stopping twice is harmless
    assert report.leftover_pids == () and report.port_free


def test_the_server_has_its_own_process_group_in_its_owners_session(tmp_path):
    # Its own group: stopped as a whole (terminate_group). The owner's session: a session of its
    # own is scheduled as a separate CPU group on Linux (autogroup), and a busy server there
    # starved the owner's session, where the replaying client and Ray run (engine/vllm.py).
    with VllmServer("m", [], tmp_path / "log", python=stand_in(tmp_path), startup_timeout=20) as srv:
        guard = srv.proc.pid
        server = psutil.Process(guard).children()[-1].pid
        for pid in (guard, server):
            assert os.getpgid(pid) == guard != os.getpgid(0)
            assert os.getsid(pid) == os.getsid(0)
