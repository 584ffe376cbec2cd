"""Workloads: what every trial replays, materialized once so all trials see the same requests.

A scenario turns its config into a `Workload` (frozen requests with exact prompt token
ids, fixed output lengths and arrival offsets). New scenarios and trace importers add a
module and an entry in `SCENARIOS`.
"""

from .base import Request, Workload
from .chat import chat_workload

SCENARIOS = {"chat": chat_workload}


def build_workload(spec, vocab_size: int) -> Workload:
    """Materialize the workload a `WorkloadSpec` describes for a model with `vocab_size` tokens."""
    return SCENARIOS[spec.scenario](spec, vocab_size)


__all__ = ["Request", "Workload", "build_workload", "SCENARIOS"]
