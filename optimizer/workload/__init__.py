"""Workloads: what every trial replays, materialized once so all trials see the same requests.

A scenario turns its spec (`config/workload_spec.py`) into a `Workload`: frozen requests with exact prompt
token ids, fixed output lengths and arrival offsets. One module per scenario:

    chat    short questions and long documents              chat.py
    agent   multi-turn tool-call loops, growing context     agent.py
    batch   offline, everything queued at once              batch.py
    rag     long shared prefixes (prefix caching matters)   rag.py
    burst   a base rate with sharp spikes                   burst.py
    trace   a recorded trace (ShareGPT, BurstGPT, Azure,    trace.py, traces/
            Mooncake, generic JSONL)
    text    real text through the model's chat template:     text/
            passages asked back (copy-heavy), open questions
    observed  what live vLLM servers reported (a traffic     observed.py
              window the daemon wrote), same shape
"""

from optimizer.workload.agent import agent_workload
from optimizer.workload.base import Request, Workload
from optimizer.workload.batch import batch_workload
from optimizer.workload.burst import burst_workload
from optimizer.workload.chat import chat_workload
from optimizer.workload.observed import observed_workload
from optimizer.workload.rag import rag_workload
from optimizer.workload.text.scenario import text_workload
from optimizer.workload.tokens import Vocabulary
from optimizer.workload.trace import trace_workload

SCENARIOS = {"chat": chat_workload, "agent": agent_workload, "batch": batch_workload, "rag": rag_workload,
             "burst": burst_workload, "trace": trace_workload, "text": text_workload,
             "observed": observed_workload}


def build_workload(spec, vocab: Vocabulary) -> Workload:
    """Materialize the workload a scenario spec describes, with prompt tokens from `vocab`."""
    return SCENARIOS[spec.scenario](spec, vocab)


__all__ = ["Request", "Workload", "Vocabulary", "build_workload", "SCENARIOS"]
