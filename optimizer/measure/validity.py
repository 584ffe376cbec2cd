"""Is a replay's measurement trustworthy? A lagging client measures itself, not vLLM.

A replay is flagged `replay_invalid` (told FAIL and retried, never scored) when:
- the median lateness of sends against the schedule is above `max_lag_p50_ms`;
- on an open-loop schedule, the achieved send rate falls below `min_rate_ratio` of the
  scheduled rate (sends are the client's job: only the client can make them late);
- the server's token counters disagree with what the workload sent and asked for (the
  client lost or invented tokens, or something else used the server during the window).
  When /metrics could not be read the check cannot run: the trial records
  `server_metrics_read` 0 instead of passing in silence.
"""

from __future__ import annotations

from optimizer.failure import Failure
from optimizer.measure.replay import RequestRecord
from optimizer.workload import Workload

REMEDY = ("the client could not keep its schedule: give trials more CPUs (ray.trial_cpus), lower the "
          "request rate, or run the driver off the server's machine")


def send_rate_ratio(workload: Workload, records: tuple[RequestRecord, ...]) -> float | None:
    """Achieved / scheduled send rate over the open-loop requests (None for a closed loop or < 3 requests)."""
    if workload.concurrency is not None:
        return None
    pairs = [(req.offset_s, rec.sent_s) for req, rec in zip(workload.requests, records) if req.after is None]
    if len(pairs) < 3:
        return None
    scheduled = max(p[0] for p in pairs) - min(p[0] for p in pairs)
    achieved = max(p[1] for p in pairs) - min(p[1] for p in pairs)
    if scheduled <= 0:
        return None
    return scheduled / achieved if achieved > 0 else float("inf")


def token_mismatch(workload: Workload, records: tuple[RequestRecord, ...], server: dict) -> str | None:
    """How the server's token counters disagree with what the workload sent (prompt ids, fixed
    output lengths), or None. Skipped when requests failed (the server legitimately counts less)."""
    if "prompt_tokens" not in server or any(not r.ok for r in records):
        return None
    sent = sum(len(r.prompt_token_ids) for r in workload.requests)
    asked = sum(r.max_tokens for r in workload.requests)
    if (sent, asked) != (server["prompt_tokens"], server["generation_tokens"]):
        return (f"the workload sent {sent} prompt tokens and asked for {asked} output tokens, the server "
                f"counted {server['prompt_tokens']:.0f} / {server['generation_tokens']:.0f}")
    return None


def check(workload: Workload, records: tuple[RequestRecord, ...], metrics: dict, server: dict,
          max_lag_p50_ms: float, min_rate_ratio: float) -> Failure | None:
    """The reason this replay cannot be scored, or None."""
    lag = metrics.get("schedule_lag_p50_ms", 0.0)
    if lag > max_lag_p50_ms:
        return Failure("replay_invalid", f"median schedule lag {lag:.1f} ms > {max_lag_p50_ms:g} ms", REMEDY)
    ratio = metrics.get("send_rate_ratio")
    if ratio is not None and ratio < min_rate_ratio:
        return Failure("replay_invalid", f"sent at {ratio:.1%} of the scheduled rate (< {min_rate_ratio:.0%})", REMEDY)
    mismatch = token_mismatch(workload, records, server)
    if mismatch:
        return Failure("replay_invalid", mismatch, "something else used the server during the window, or the "
                       "client miscounted: read the server log and the request records")
    return None
