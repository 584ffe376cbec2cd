"""Real local Ray, no vLLM: a trial's worker dies (SIGKILL, as Ray's memory monitor does)
while its server runs; the driver reaps the server's process group."""

import os
import signal
import subprocess
import sys

import pytest
import ray

from optimizer.driver.ray_runtime import ray_runtime, reap_server
from optimizer.engine.vllm import group_pids
from optimizer.trial.channel import TrialBoard

pytestmark = pytest.mark.integration


@ray.remote(max_retries=0)
def _trial_that_dies(board):
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    import socket
    ray.get(board.server.remote(3, socket.gethostname(), server.pid))
    os.kill(os.getpid(), signal.SIGKILL)


def test_driver_reaps_the_server_of_a_dead_worker():
    with ray_runtime(None):
        board = TrialBoard.remote()
        with pytest.raises(ray.exceptions.RayError):
            ray.get(_trial_that_dies.remote(board))
        host, pgid = ray.get(board.server_of.remote(3))
        assert group_pids(pgid), "the orphaned server should still be running before reaping"
        assert reap_server(board, 3) is True
        assert group_pids(pgid) == []

