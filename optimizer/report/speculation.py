"""What speculative decoding did in a study: per trial that drafted tokens, the acceptance, tokens
per verification step, acceptance by draft position and the prefix-cache hit rate beside them,
against the trials that ran without it. Read from the server's own counters over the replay
(engine/server_metrics.py), as the trial recorded them (`server`).
"""

from __future__ import annotations

import json

import optuna

from optimizer.engine.speculative_config import KNOB, OFF, given
from optimizer.record import of_trial

COMPLETE = optuna.trial.TrialState.COMPLETE


def note_line(server: dict) -> str | None:
    """'accepted 87% of 156 drafted tokens (4.49 tokens per step; by position 97%, 92%, 87%, 74%);
    prefix-cache hit rate 40%', or None when the trial drafted nothing."""
    acceptance = (server or {}).get("spec_acceptance")
    if acceptance is None:
        return None
    parts = [f"accepted {acceptance:.0%} of {server.get('spec_draft_tokens', 0):.0f} drafted tokens"]
    inner = []
    if server.get("spec_mean_accepted_length") is not None:
        inner.append(f"{server['spec_mean_accepted_length']:.2f} tokens per step")
    positions = by_position(server)
    if positions:
        inner.append("by position " + ", ".join(f"{p:.0%}" for p in positions))
    text = parts[0] + (f" ({'; '.join(inner)})" if inner else "")
    hits = server.get("prefix_cache_hit_rate")
    return text + (f"; prefix-cache hit rate {hits:.0%}" if hits is not None else "")


def by_position(server: dict) -> list[float]:
    """Acceptance at each draft position, first to last (how far into a draft the target agrees)."""
    prefix = "spec_accepted_pos_"
    keys = sorted((int(k[len(prefix):]), k) for k in server if k.startswith(prefix) and k[len(prefix):].isdigit())
    return [float(server[k]) for _, k in keys]


def method_of(t: optuna.trial.FrozenTrial) -> str:
    """'ngram, 4 tokens, lookup 2-4' for a trial's speculative config; 'off' when it had none."""
    text = t.params.get(KNOB) or given([str(a) for a in of_trial.vllm_args(t)]) or OFF
    if text == OFF:
        return OFF
    try:
        cfg = json.loads(text)
    except ValueError:
        return str(text)
    out = [str(cfg.get("method") or "draft model")]
    if cfg.get("num_speculative_tokens"):
        out.append(f"{cfg['num_speculative_tokens']} tokens")
    if cfg.get("prompt_lookup_min") or cfg.get("prompt_lookup_max"):
        out.append(f"lookup {cfg.get('prompt_lookup_min', 1)}-{cfg.get('prompt_lookup_max', '?')}")
    if cfg.get("num_speculative_tokens_per_batch_size"):
        out.append("per batch size " + " ".join(f"{a}-{b}:{k}" for a, b, k in cfg["num_speculative_tokens_per_batch_size"]))
    if cfg.get("model"):
        out.append(f"draft {cfg['model']}")
    return ", ".join(out)


def rows(study: optuna.Study) -> list[list[str]]:
    """The report's table, one row per measured trial, when any trial drafted tokens; [] otherwise."""
    done = [t for t in study.get_trials(deepcopy=False, states=(COMPLETE,)) if not of_trial.is_repeat(t)]
    if not any("spec_acceptance" in of_trial.server(t) for t in done):
        return []
    out = []
    for t in done:
        server = of_trial.server(t)
        value = f"{t.values[0]:.4g}" if t.values else "-"
        acc = server.get("spec_acceptance")
        length = server.get("spec_mean_accepted_length")
        hits = server.get("prefix_cache_hit_rate")
        running = server.get("running_peak")
        out.append([str(t.number), method_of(t), value,
                    f"{acc:.0%}" if acc is not None else "-",
                    f"{length:.2f}" if length is not None else "-",
                    ", ".join(f"{p:.0%}" for p in by_position(server)) or "-",
                    f"{hits:.0%}" if hits is not None else "-",
                    f"{running:.0f}" if running is not None else "-"])
    return out


HEADERS = ("#", "speculation", "objective", "accepted", "tokens per step", "by draft position",
           "prefix-cache hit rate", "running at peak")


def section(doc, study: optuna.Study, objective) -> None:
    """The written report's section (`doc`: report/written.py's document), when a trial drafted tokens."""
    found = rows(study)
    if not found:
        return
    doc.heading("Speculative decoding")
    doc.para("What the servers' own counters said over each replay: the share of drafted tokens the target "
             "accepted, tokens per verification step, acceptance by draft position, and the prefix-cache hit "
             "rate beside them (speculation can lower it).")
    headers = list(HEADERS)
    headers[2] = f"{objective.metric} ({objective.unit})"
    doc.table(headers, found)
