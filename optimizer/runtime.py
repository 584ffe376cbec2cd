"""The Ray runtime for trials: an embedded local instance by default, a cluster when named.

`ray.init(address="local")` always starts a fresh local instance; a bare `ray.init()`
would try to join a cluster a past `ray start` left in /tmp/ray (FACTS.md). Trials are
tasks with `max_retries=0`: the driver decides what to retry, so no trial runs twice unseen.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import ray

from .errors import RayUnavailable
from .trial import remote_trial


@ray.remote(num_cpus=0)
class PhaseBoard:
    """Where running trials post their phase ('starting', 'replaying', ...) for the driver."""

    def __init__(self):
        self.phases: dict[int, str] = {}

    def set(self, number: int, phase: str) -> None:
        self.phases[number] = phase

    def get(self) -> dict[int, str]:
        return dict(self.phases)


run_trial = ray.remote(max_retries=0)(remote_trial)


@contextmanager
def ray_runtime(address: str | None):
    """Start (or join) Ray for the duration of a study; shut it down afterwards."""
    address = address or os.environ.get("RAY_ADDRESS")
    try:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False,
                     log_to_driver=False, object_store_memory=256 * 1024**2)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise RayUnavailable(f"ray: cannot reach cluster at '{address}' ({str(exc).splitlines()[0][:160]}); "
                             "check --ray-address, or leave it out to run on this machine") from exc
    try:
        yield
    finally:
        ray.shutdown()
