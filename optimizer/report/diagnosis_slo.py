"""The diagnosis's SLO rule (report/diagnosis.py `_RULES`): which SLO a completed trial missed, by
how much over its limit, and the knob that usually moves that SLO, in operator words."""

from __future__ import annotations

import math
import re

import optuna

from optimizer.record import of_trial
from optimizer.report.diagnosis_evidence import _Facts, _float, _Found, _n, _queued

COMPLETE = optuna.trial.TrialState.COMPLETE

_SLO = re.compile(r"^(ttft|tpot|itl|e2el)_p(\d+)$")


def slo_missed(f: _Facts, ctx) -> _Found | None:
    """The rule: a COMPLETE trial that exceeded an SLO, the worst first, with the knob that moves it."""
    excess = of_trial.slo_excess(f.attrs)
    missed = {k: v for k, v in excess.items() if v is None or v > 0}
    if f.state != COMPLETE or not missed:
        return None
    worst = sorted(missed, key=lambda k: -math.inf if missed[k] is None else -missed[k])
    words, remedy = _slo_words(f, worst[0], missed[worst[0]])
    if worst[1:]:
        words += f" ({', '.join(_slo_name(k) for k in worst[1:])} missed too)"
    if of_trial.value_from_partial_run(f.attrs):
        words += "; the run was cut once it could not recover"
    early = of_trial.early_stop(f.attrs)
    return _Found(words, remedy, f"slo_excess {excess}" + (f"; early stop: {early.get('reason', '')}" if early else ""))


def _slo_name(key: str) -> str:
    """'ttft_p95' -> 'p95 TTFT' (slo.Slo's words)."""
    m = _SLO.match(key)
    return f"p{m.group(2)} {m.group(1).upper()}" if m else "error rate"


def _slo_words(f: _Facts, key: str, excess: float | None) -> tuple[str, str]:
    """('p95 TTFT 812 ms is 62% over its 500 ms limit', the knob that usually moves it)."""
    m = _SLO.match(key)
    if not m:  # error_pct: (observed - limit) / limit of a percentage
        rate = _float(f.metrics.get("error_rate"))
        allows = f"; the error SLO allows {_n(rate * 100 / (1 + excess))}%" if rate and excess is not None else ""
        seen = f"{rate:.1%} of requests failed" if rate is not None else "requests failed"
        return seen + allows, ("read the request errors: a 400 usually means a prompt longer than "
                               f"max-model-len{f.now('max-model-len')}")
    metric, pct = m.groups()
    name, observed = _slo_name(key), _float(f.metrics.get(f"{metric}_ms_p{pct}"))
    if excess is None:
        words = f"{name} was not measured (no request gave one), so its SLO counts as missed"
    elif observed is not None:
        words = f"{name} {_n(observed)} ms is {excess:.0%} over its {_n(observed / (1 + excess))} ms limit"
    else:
        words = f"{name} is {excess:.0%} over its limit"
    if metric == "ttft":
        if _queued(f):
            return words, f"requests waited for a slot: raise max-num-seqs{f.now('max-num-seqs')}"
        if f.knobs.get("enable-chunked-prefill") is False:
            return words, "turn chunked prefill on (a long prompt then no longer holds up every first token)"
        return words, (f"raise max-num-batched-tokens{f.now('max-num-batched-tokens')} so more prompt is prefilled "
                       f"per step, or lower max-num-seqs{f.now('max-num-seqs')} so fewer decodes share it")
    if metric in ("tpot", "itl"):
        return words, (f"lower max-num-seqs{f.now('max-num-seqs')}: fewer requests share each decode step "
                       "(a smaller max-num-batched-tokens also lets prefills interrupt decodes less)")
    return words, f"lower max-num-seqs{f.now('max-num-seqs')}: smaller batches finish each request sooner"
