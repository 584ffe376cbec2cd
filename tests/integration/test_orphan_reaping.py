"""Real local Ray, no vLLM: a trial's worker dies (SIGKILL, as Ray's memory monitor does)
while its server runs.

- A server started through VllmServer (a stand-in that answers /health and leaves a grandchild
  ignoring SIGTERM, as a starting EngineCore does) is stopped by its own guard, with no
  driver involved; the driver then finds nothing to reap and says GONE.
- A bare process group with no guard (the second line of defence): the driver reaps it.
"""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import ray

from optimizer.driver.ray_runtime import GONE, REAPED, ray_runtime, reap_server
from optimizer.engine import lifeline
from optimizer.engine.vllm import VllmServer, group_pids
from optimizer.testing import server_tree
from optimizer.testing.stand_in_server import write_stand_in
from optimizer.trial.channel import TrialBoard

pytestmark = pytest.mark.integration

@ray.remote(max_retries=0)
def _bare_server_then_die(board):
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    ray.get(board.server.remote(3, socket.gethostname(), server.pid))
    os.kill(os.getpid(), signal.SIGKILL)


@ray.remote(max_retries=0)
def _guarded_server_then_die(board, stand_in: str, log: str):
    server = VllmServer("m", [], log, python=stand_in, startup_timeout=60)
    assert server.start()
    ray.get(board.server.remote(4, socket.gethostname(), server.proc.pid))
    os.kill(os.getpid(), signal.SIGKILL)  # no finally runs: only the guard can stop the server


def test_a_guarded_server_stops_with_its_worker_and_the_driver_finds_it_gone(tmp_path):
    exe = write_stand_in(tmp_path, stubborn_child=True)
    with ray_runtime(None):
        board = TrialBoard.remote()
        with pytest.raises(ray.exceptions.RayError):
            ray.get(_guarded_server_then_die.remote(board, str(exe), str(tmp_path / "server.log")))
        died = time.monotonic()
        _, pgid = ray.get(board.server_of.remote(4))
        assert server_tree.gone_after(pgid, died, lifeline.GRACE_S + 10) is not None, \
            "the guard did not stop the server of its dead worker"
        assert reap_server(board, 4) == GONE
    assert "the owner (pid" in (tmp_path / "server.log").read_text()


def test_the_driver_reaps_a_bare_group_of_a_dead_worker():
    with ray_runtime(None):
        board = TrialBoard.remote()
        with pytest.raises(ray.exceptions.RayError):
            ray.get(_bare_server_then_die.remote(board))
        host, pgid = ray.get(board.server_of.remote(3))
        assert group_pids(pgid), "a group with no guard should still be running before reaping"
        assert reap_server(board, 3) == REAPED
        assert group_pids(pgid) == []
