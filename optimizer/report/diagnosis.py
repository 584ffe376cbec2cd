"""Diagnosis in operator words: why a finished trial failed or fell behind, and what to change.

Each trial reads from what it recorded (driver/tell.record: failure kind, evidence, remedy,
metrics, the server's /metrics view, SLO excess, early stop; a regression check's flip
rate). The rules follow vLLM's troubleshooting and tuning guides ("Conserving memory",
"Optimization and Tuning"), tried in order; the first that matches wins (as in
engine/failures.py):

    kind            when                                           remedy
    output_changed  answers flipped beyond the study's limit       undo the precision/backend flag; `regress`
    infra           not the configuration's fault (FAIL)           the recorded remedy
    replay_invalid  the client could not be trusted (FAIL)         the recorded remedy
    no_kv_room      oom_startup: weights + runtime leave no KV     raise gpu-memory-utilization above the need
    oom_at_start    oom_startup otherwise                          lower gpu-memory-utilization to what is free
    kv_too_small    max-model-len does not fit the KV cache        lower it to vLLM's estimate / raise util / fp8
    oom_under_load  oom_runtime, or a crash under load at the      lower max-num-seqs or max-model-len
                    max-num-seqs cap or with the KV cache full
    invalid_config, timeout, request_errors, crash                 the evidence and the recorded remedy
    early_stopped   cut short: could not beat the best             nothing to fix
    other_failure   any other failure kind                         the recorded remedy
    preemptions     vLLM preempted requests (KV cache ran full)    raise gpu-memory-utilization / lower max-num-seqs
    queuing         requests waited, running at the cap, and the   raise max-num-seqs; check upstream concurrency
                    objective clearly behind the best
    slo_missed      COMPLETE but an SLO is exceeded                the knob that moves that SLO
    speculation     speculative decoding on (its counters moved)   turn it off for this traffic, or draft
                    and clearly behind the best                    fewer tokens
    light_load      running far below the cap, KV cache nearly     load harder: the result says little
                    empty, nothing queued
    behind_best     clearly behind the best, nothing above         its flags are slower here
                    explains it

Server-side causes (preemptions, queuing) come before their symptom (slo_missed): the cause
names the knob that fixes it. A healthy COMPLETE trial within the noise of the best gets None.
What a trial recorded (_Facts) and the start-up memory rules (no_kv_room, oom_at_start,
kv_too_small: vLLM's memory lines read into GiB figures) are in report/diagnosis_evidence.py; the
SLO rule (which SLO, by how much, the knob that usually moves it) in report/diagnosis_slo.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import optuna

from optimizer.record import of_study, of_trial
from optimizer.report.diagnosis_evidence import (
    _Facts,
    _float,
    _Found,
    _gist,
    _kv_too_small,
    _n,
    _no_kv_room,
    _oom_at_start,
    _queued,
    prefix_hits_without_speculation,
)
from optimizer.report.diagnosis_slo import slo_missed

COMPLETE, PRUNED, FAIL = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED,
                          optuna.trial.TrialState.FAIL)

# A trial is "weak" when its objective is this share worse than the study's best: single runs
# move ~10% here (earlystop's margin), so twice that is a real gap, not noise.
WEAK_SHORTFALL = 0.2
# The running gauge is sampled (every metrics_poll_s), so its true peak can fall between two
# samples: 90% of max-num-seqs counts as running at the cap.
AT_CAP_SHARE = 0.9
# vllm:kv_cache_usage_perc is a fraction (1 = full). Preemption starts when the cache is full;
# a sampled peak of 90% means it was at or near full.
FULL_KV = 0.9
# Light load: at most a quarter of the allowed sequences ever ran and the KV cache stayed
# under a quarter full; the configuration's batch limits were never reached.
LIGHT_RUNNING_SHARE = 0.25
LIGHT_KV = 0.25
# Any preemption means a request's KV cache was evicted and recomputed: already a latency cost.
MIN_PREEMPTIONS = 1
# Share of compared answers allowed to change when the study recorded no limit (a guess, not
# measured here): greedy runs of one configuration differ only at near-ties.
DEFAULT_MAX_FLIP_RATE = 0.02
# A prefix-cache hit rate 5 points below the trials without speculation is said beside speculation's cost:
# the workload is the same in every trial, so the hits should be too.
PREFIX_FALL = 0.05
PRECISION_FLAGS = ("kv-cache-dtype", "dtype", "attention-backend", "speculative-config")  # change the arithmetic


@dataclass(frozen=True)
class Diagnosis:
    trial: int
    kind: str  # a rule id (KINDS)
    cause: str  # one line, operator words, with the numbers it rests on
    remedy: str  # one line
    evidence: str  # the log line or the metric values


@dataclass(frozen=True)
class Context:
    """What a rule needs from the whole study."""

    best: float | None  # the best feasible objective value (None: none, or a multi-objective study)
    direction: str = "maximize"
    metric: str = "value"  # the objective's metric, e.g. output_throughput
    max_flip_rate: float | None = None  # the regression check's limit, when the study records one
    fp8_kv: bool = True  # whether the device can run an fp8 KV cache (the study's `fp8_kv` stamp)
    prefix_hits_off: float | None = None  # the prefix-cache hit rate of the trials without speculation (median)

    def shortfall(self, value: float | None) -> float | None:
        """How far `value` is behind the best, as a share of it (0.3: 30% worse); None if unknown."""
        if self.best is None or value is None or not math.isfinite(value) or not self.best:
            return None
        gap = self.best - value if self.direction == "maximize" else value - self.best
        return gap / abs(self.best)

    def behind(self, value: float) -> str:
        """'output_throughput 41.2 is 38% below the best 66.5'."""
        word = "below" if self.direction == "maximize" else "above"
        return f"{self.metric} {_n(value)} is {self.shortfall(value):.0%} {word} the best {_n(self.best)}"


def context_of(study: optuna.Study) -> Context:
    """The study's best feasible value (Optuna's rule: constraints <= 0), direction, objective
    metric (from its `objective` stamp, 'name:metric ...') and `max_flip_rate` if recorded."""
    direction = "maximize" if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else "minimize"
    stamp = of_study.objective(study)
    metric = stamp.split(" ", 1)[0].partition(":")[2] or "value"
    best = None
    if len(study.directions) == 1:
        values = [t.value for t in study.get_trials(deepcopy=False, states=(COMPLETE,))
                  if t.value is not None and all(c <= 0 for c in (t.constraints or {}).values())]
        best = (max if direction == "maximize" else min)(values) if values else None
    return Context(best, direction, metric, _float(of_study.max_flip_rate(study)),
                   of_study.fp8_kv(study) is not False, prefix_hits_without_speculation(study))


def diagnose(trial: optuna.trial.FrozenTrial, context: Context) -> Diagnosis | None:
    """The first rule that matches the trial; None for a healthy trial (or one not finished)."""
    if trial.state not in (COMPLETE, PRUNED, FAIL):
        return None
    facts = _Facts.of(trial)
    for rule in _RULES:
        found = rule.match(facts, context)
        if found is not None:
            return Diagnosis(trial.number, rule.kind, *found)
    return None


def diagnose_study(study: optuna.Study) -> list[Diagnosis]:
    """A diagnosis for every failed or weak trial, in trial order."""
    context = context_of(study)
    found = (diagnose(t, context) for t in study.get_trials(deepcopy=False))
    return [d for d in found if d is not None]


@dataclass(frozen=True)
class _Rule:
    kind: str
    match: Callable[[_Facts, Context], _Found | None]


def _output_changed(f: _Facts, ctx: Context) -> _Found | None:
    reg = of_trial.regression(f.attrs)
    rate = _float(reg.get("flip_rate"))
    limit = next((x for x in (ctx.max_flip_rate, _float(reg.get("max_flip_rate"))) if x is not None),
                 DEFAULT_MAX_FLIP_RATE)
    if f.failure != "output_changed" and (rate is None or rate <= limit):
        return None
    # Only sampled knobs differ between trials; fixed flags (engine.extra_args) are the same in the reference.
    changed = [f.knob(k) for k in PRECISION_FLAGS if k in f.sampled and str(f.knobs.get(k)) not in ("auto", "off")]
    if rate is not None:
        what = f"{_pct(rate)} of answers changed (limit {_pct(limit)})"
    else:
        what = f"the answers changed ({_gist(f.evidence)})" if f.evidence else "the answers changed"
    if changed:
        cause = f"{what}: {', '.join(changed)} changed the outputs"
        remedy = (f"go back to the reference {' / '.join(c.split()[0] for c in changed)} or accept the change "
                  "knowingly; check the answers with `python -m optimizer regress`")
    else:
        cause = f"{what} with no precision, attention-backend or speculation knob changed"
        remedy = "re-check with `python -m optimizer regress` before deploying this configuration"
    evidence = f.evidence if f.failure == "output_changed" else f"regression: {reg}"[:500]
    return _Found(cause, remedy, evidence)


def _oom_under_load(f: _Facts, ctx: Context) -> _Found | None:
    running, kv, cap = f.get("running_peak"), f.get("kv_cache_usage_peak"), f.max_num_seqs
    at_cap = running is not None and cap is not None and running >= AT_CAP_SHARE * cap
    full = kv is not None and kv >= FULL_KV
    if not (f.failure == "oom_runtime" or (f.failure == "crash" and f.under_load and (at_cap or full))):
        return None
    load = []
    if running is not None:
        load.append(f"{_n(running)} requests running" + (f" of max-num-seqs {cap}" if cap else ""))
    if kv is not None:
        load.append(f"the KV cache {kv:.0%} full")
    how = "ran out of memory" if f.failure == "oom_runtime" else "died"
    cause = f"the server {how} under load" + (f" with {' and '.join(load)}" if load else
                                              f" ({f.knob('max-num-seqs')}, {f.knob('max-model-len')})")
    evidence = "; ".join(x for x in (f.evidence, f.server_evidence("running_peak", "kv_cache_usage_peak")) if x)
    return _Found(cause, f"lower max-num-seqs{f.now('max-num-seqs')} or max-model-len{f.now('max-model-len')}",
                  evidence)


def _recorded(kind: str, lead: str | Callable[[_Facts], str]) -> _Rule:
    """A failure whose evidence says it all: the cause is its gist, the remedy the recorded one."""
    def match(f: _Facts, ctx: Context) -> _Found | None:
        if f.failure != kind:
            return None
        words = lead(f) if callable(lead) else lead
        return _Found(f"{words}: {_gist(f.evidence)}" if f.evidence else words, f.remedy or "read the server log",
                      f.evidence)
    return _Rule(kind, match)


def _early_stopped(f: _Facts, ctx: Context) -> _Found | None:
    if f.failure != "early_stopped":
        return None
    early = of_trial.early_stop(f.attrs)
    when = (f" after {early['finished']} of {early['planned']} requests"
            if {"finished", "planned"} <= early.keys() else "")
    lead = "cut short" if early.get("by") == "slo" else "not a fault: cut short"
    return _Found(f"{lead}{when}, {f.evidence}", f.remedy or "nothing to fix", f.evidence)


def _other_failure(f: _Facts, ctx: Context) -> _Found | None:
    if not f.failure and f.state == COMPLETE:
        return None
    what = f.failure or f"told {f.state.name} with nothing recorded"
    return _Found(f"{what}: {_gist(f.evidence)}" if f.evidence else what, f.remedy or "read the server log",
                  f.evidence)


def _preemptions(f: _Facts, ctx: Context) -> _Found | None:
    n = f.get("preemptions")
    if n is None or n < MIN_PREEMPTIONS:
        return None
    kv = f.get("kv_cache_usage_peak")
    full = f" (peak {kv:.0%} used)" if kv is not None else ""
    return _Found(f"vLLM preempted {_n(n)} requests: the KV cache{full} ran out of room for the running batch",
                  f"raise gpu-memory-utilization{f.now('gpu-memory-utilization')} for a larger KV cache, or lower "
                  f"max-num-seqs{f.now('max-num-seqs')}",
                  f.server_evidence("preemptions", "kv_cache_usage_peak", "running_peak", "waiting_peak"))


def _queuing(f: _Facts, ctx: Context) -> _Found | None:
    cap, running, gap = f.max_num_seqs, f.get("running_peak"), ctx.shortfall(f.value)
    if cap is None or running is None or running < AT_CAP_SHARE * cap or not _queued(f) \
            or gap is None or gap <= WEAK_SHORTFALL:
        return None
    waiting, mean = f.get("waiting_peak") or 0, f.get("queue_time_mean_ms")
    waited = f"waiting requests peaked at {_n(waiting)}" if waiting else f"requests waited {_n(mean)} ms on average"
    held = (f"running stayed at max-num-seqs {cap}" if running >= cap
            else f"running peaked at {_n(running)} of max-num-seqs {cap}")
    kv = f.get("kv_cache_usage_peak")
    room = "" if kv is None else (f" (the KV cache peaked at {kv:.0%}: there is room)" if kv < FULL_KV else
                                  f" together with gpu-memory-utilization (the KV cache peaked at {kv:.0%})")
    return _Found(f"{waited} while {held}; {ctx.behind(f.value)}",
                  f"raise max-num-seqs above {cap}{room}, and check that nothing upstream (proxy, client pool) "
                  "caps concurrency lower in production",
                  f.server_evidence("waiting_peak", "running_peak", "queue_time_mean_ms", "kv_cache_usage_peak")
                  + f"; {ctx.metric}={_n(f.value)} best={_n(ctx.best)}")


def _speculation(f: _Facts, ctx: Context) -> _Found | None:
    """Speculation costs a verification pass per step; it pays when drafts are accepted and the batch
    has compute to spare, and loses when they are not or the batch is full. Where the prefix cache hit
    less than it did without speculation, that is said too (users report the hits falling with it on)."""
    acceptance, gap = f.get("spec_acceptance"), ctx.shortfall(f.value)
    if f.state != COMPLETE or acceptance is None or gap is None or gap <= WEAK_SHORTFALL:
        return None
    running, length = f.get("running_peak"), f.get("spec_mean_accepted_length")
    at = f" at up to {_n(running)} running sequences" if running is not None else ""
    per_step = f" ({length:.2f} tokens per step)" if length is not None else ""
    return _Found(f"speculative decoding accepted {acceptance:.0%} of its drafted tokens{per_step}{at}; "
                  f"{ctx.behind(f.value)}: verifying the drafts cost more than they saved{_prefix_fall(f, ctx)}",
                  "turn speculation off for this traffic, or draft fewer tokens (num_speculative_tokens); it pays "
                  "where outputs repeat the prompt and the batch has compute to spare",
                  f.server_evidence("spec_acceptance", "spec_mean_accepted_length", "running_peak",
                                    "prefix_cache_hit_rate") + f"; {ctx.metric}={_n(f.value)} best={_n(ctx.best)}")


def _prefix_fall(f: _Facts, ctx: Context) -> str:
    """'; the prefix-cache hit rate fell from 73% without speculation to 40%', when it fell by 5 points or more."""
    on, off = f.get("prefix_cache_hit_rate"), ctx.prefix_hits_off
    if on is None or off is None or off - on < PREFIX_FALL:
        return ""
    return f"; the prefix-cache hit rate fell from {off:.0%} without speculation to {on:.0%}"


def _light_load(f: _Facts, ctx: Context) -> _Found | None:
    cap, running, kv = f.max_num_seqs, f.get("running_peak"), f.get("kv_cache_usage_peak")
    if f.state != COMPLETE or of_trial.rate_search(f.attrs) or cap is None or running is None or kv is None:
        return None  # a goodput search picks the rate itself: its load is what the SLOs allow
    if running > LIGHT_RUNNING_SHARE * cap or kv >= LIGHT_KV or _queued(f):
        return None
    return _Found(f"at most {_n(running)} of max-num-seqs {cap} requests ran at once, the KV cache peaked at "
                  f"{kv:.0%} and nothing queued: the load never pushed the server",
                  "the load-test settings are too light: raise the workload's request rate or concurrency; "
                  "until then this result says little about the configuration",
                  f.server_evidence("running_peak", "kv_cache_usage_peak", "waiting_peak", "queue_time_mean_ms"))


def _behind_best(f: _Facts, ctx: Context) -> _Found | None:
    gap = ctx.shortfall(f.value)
    if f.state != COMPLETE or gap is None or gap <= WEAK_SHORTFALL:
        return None
    knobs = ", ".join(f.knob(k) for k in f.knobs) or "vLLM defaults"
    return _Found(f"{ctx.behind(f.value)}, with no preemption, queue or SLO miss to explain it",
                  f"nothing failed: these flags ({knobs}) are slower on this workload; compare them with the "
                  "best trial's",
                  f"{ctx.metric}={_n(f.value)} best={_n(ctx.best)}; "
                  + (f.server_evidence("running_peak", "waiting_peak", "kv_cache_usage_peak") or "no server view"))


_RULES = (
    _Rule("output_changed", _output_changed),  # wrong answers disqualify whatever the speed
    _recorded("infra", "not the configuration's fault"),
    _recorded("replay_invalid", "the measurement cannot be trusted"),
    _Rule("no_kv_room", _no_kv_room),  # before oom_at_start: the same kind, the opposite remedy
    _Rule("oom_at_start", _oom_at_start),
    _Rule("kv_too_small", _kv_too_small),
    _Rule("oom_under_load", _oom_under_load),  # before crash: a crash at the cap is memory
    _recorded("invalid_config", "vLLM rejected the flags"),
    _recorded("timeout", "no /health within the start-up deadline; last line"),
    _recorded("request_errors", "requests failed, so the run was not scored"),
    _recorded("crash", lambda f: "the server died under load" if f.under_load else "the server exited at start"),
    _Rule("early_stopped", _early_stopped),
    _Rule("other_failure", _other_failure),  # from here on: COMPLETE trials only
    _Rule("preemptions", _preemptions),  # before queuing: raising max-num-seqs would preempt more
    _Rule("queuing", _queuing),  # before slo_missed: the wait is part of TTFT, the cap the knob
    _Rule("slo_missed", slo_missed),  # before light_load: a miss says the load mattered
    _Rule("speculation", _speculation),  # before light_load: a light load does not explain drafts rejected
    _Rule("light_load", _light_load),
    _Rule("behind_best", _behind_best),
)
KINDS = tuple(r.kind for r in _RULES)


def _pct(x: float) -> str:
    return f"{x:.1%}" if x < 0.1 else f"{x:.0%}"
