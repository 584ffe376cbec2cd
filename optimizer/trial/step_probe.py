"""Send the step probe's groups (built by twin/probe.py, carried in the TrialSpec) to the server
after its measured run: each group at once, one group after the other, and keep what each request took.
"""

from __future__ import annotations

from optimizer.measure.replay import run_replay
from optimizer.workload.base import Request


def send(base_url: str, model: str, groups: tuple, request_timeout: float) -> list[list[list]]:
    """Per group, per request: [sent_s, first_token_s, end_s, prompt_tokens, output_tokens, ok]
    (seconds from the group's start; a request that never came back: not ok)."""
    out = []
    for group in groups:
        records = {r.id: r for r in run_replay(base_url, model, group, None, request_timeout).records}
        out.append([_row(records.get(q.id), q) for q in group])
    return out


def _row(rec, req: Request) -> list:
    if rec is None:
        return [0.0, None, None, len(req.prompt_token_ids), 0, False]
    return [round(rec.sent_s, 4), None if rec.first_chunk_s is None else round(rec.first_chunk_s, 4),
            None if rec.end_s is None else round(rec.end_s, 4), rec.prompt_tokens, rec.output_tokens, bool(rec.ok)]
