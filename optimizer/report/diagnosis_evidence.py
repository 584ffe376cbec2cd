"""What report/diagnosis.py's rules read, and its three rules for a server that could not start for lack of memory.

_Facts is one trial's record (driver/tell.record: failure kind, evidence, remedy, the flags it ran
with, metrics, the server's /metrics view), read once; _Found is a rule's answer. The start-up
memory rules turn vLLM's own memory lines into the figure an operator changes:

    no_kv_room    "(<free>/<total> GiB) on kv cache allocation is less than requested memory for kv
                  (<kv>/<reserved> GiB)": the weights and runtime leave no KV cache; raise
                  gpu-memory-utilization above (reserved - kv) / total, rounded up to 0.01
    oom_at_start  "(<free>/<total> GiB) on startup is less than desired GPU memory utilization
                  (<util>, <asked> GiB)": lower it to at most free / total, rounded down to 0.01
    kv_too_small  "max seq len (<n>), (<need> GiB KV cache is needed, which is larger than the
                  available KV cache memory (<have> GiB)": lower max-model-len to vLLM's estimate,
                  raise gpu-memory-utilization, or halve the KV bytes with fp8 (where the device can)

A trial driver/kv_precheck.py pruned before boot has no such line: its kv_estimate gives the figures.
Like every rule in diagnosis._RULES, each takes (facts, context) and returns a _Found or None.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import NamedTuple

import optuna

from optimizer.config.flags import from_cli_args
from optimizer.record import of_trial

GIB = 1024 ** 3


@dataclass(frozen=True)
class _Facts:
    """What one trial recorded, read once."""

    number: int
    state: optuna.trial.TrialState
    value: float | None
    failure: str  # failure kind, '' for none
    evidence: str
    remedy: str
    knobs: dict  # knob -> value (the flags it ran with override the sampled params)
    sampled: tuple[str, ...]  # the knobs Optuna chose for this trial
    metrics: dict
    server: dict
    attrs: dict

    @classmethod
    def of(cls, t: optuna.trial.FrozenTrial) -> _Facts:
        args = [str(x) for x in of_trial.vllm_args(t)]
        return cls(t.number, t.state, t.values[0] if t.values else None, of_trial.failure_kind(t),
                   of_trial.evidence(t), of_trial.remedy(t), {**t.params, **from_cli_args(args)},
                   tuple(t.params), of_trial.metrics(t), of_trial.server(t), of_trial.all_attrs(t))

    def knob(self, name: str) -> str:
        """'max-num-seqs 16' (or just the name when the trial left it at vLLM's default)."""
        value = self.knobs.get(name)
        return name if value is None else f"{name} {_flag(value)}"

    def now(self, name: str) -> str:
        """' (now 16)' for a remedy, '' when unset."""
        value = self.knobs.get(name)
        return "" if value is None else f" (now {_flag(value)})"

    def get(self, key: str) -> float | None:
        return _float(self.server.get(key))

    @property
    def max_num_seqs(self) -> int | None:
        value = self.knobs.get("max-num-seqs")
        return int(value) if value else None

    @property
    def under_load(self) -> bool:
        """It got as far as the measured replay (trial/task.py records replay_s only then)."""
        return "replay_s" in of_trial.phases(self.attrs)

    @property
    def predicted(self) -> bool:
        return of_trial.pruned_by_precheck(self.attrs)

    def server_evidence(self, *keys: str) -> str:
        shown = [f"{k}={_n(self.get(k))}" for k in keys if self.get(k) is not None]
        return "server: " + " ".join(shown) if shown else ""


class _Found(NamedTuple):
    cause: str
    remedy: str
    evidence: str


_NO_KV_ROOM = re.compile(r"requested memory for kv \(-|No available memory for the cache blocks")
_KV_SPLIT = re.compile(r"\(([\d.]+)/([\d.]+) GiB\) on kv cache allocation is less than requested memory for kv "
                       r"\((-?[\d.]+)/([\d.]+) GiB\)")
_OVER_FREE = re.compile(r"\(([\d.]+)/([\d.]+) GiB\) on startup is less than desired \w+ memory utilization "
                        r"\(([\d.]+), ([\d.]+) GiB\)")


def _memory_split(f: _Facts) -> tuple[float, float, float] | None:
    """(KV GiB, reserved GiB, total GiB) from vLLM's line, or from the precheck's estimate."""
    m = _KV_SPLIT.search(f.evidence)
    if m:
        return float(m.group(3)), float(m.group(4)), float(m.group(2))
    est, util = f.attrs.get("kv_estimate") or {}, _float(f.knobs.get("gpu-memory-utilization"))
    if f.predicted and "budget_bytes" in est and util:
        reserved = (est["budget_bytes"] + est.get("non_kv_bytes", 0)) / GIB
        return est["budget_bytes"] / GIB, reserved, reserved / util
    return None


def _no_kv_room(f: _Facts, ctx: object) -> _Found | None:
    # precheck predicts oom_startup only when the KV budget is <= 0 (precheck.predicted_result)
    if f.failure != "oom_startup" or not (_NO_KV_ROOM.search(f.evidence) or f.predicted):
        return None
    lead = "predicted before boot: " if f.predicted else ""
    split = _memory_split(f)
    if split is None:
        return _Found(f"{lead}{f.knob('gpu-memory-utilization')} leaves no room for the KV cache once the "
                      "weights and runtime are loaded",
                      "raise gpu-memory-utilization" + f.now("gpu-memory-utilization"), f.evidence)
    kv, reserved, total = split
    non_kv = reserved - kv
    need = math.ceil(non_kv / total * 100) / 100
    return _Found(f"{lead}{f.knob('gpu-memory-utilization')} reserves {reserved:.2f} GiB, the weights and runtime "
                  f"take {non_kv:.2f} GiB, leaving {kv:.2f} GiB for the KV cache",
                  f"raise gpu-memory-utilization above {need:.2f} (the weights and runtime alone take "
                  f"{non_kv:.2f} of {total:.2f} GiB)", f.evidence)


def _oom_at_start(f: _Facts, ctx: object) -> _Found | None:
    if f.failure != "oom_startup":
        return None
    m = _OVER_FREE.search(f.evidence)
    if m:
        free, total, util, asked = (float(x) for x in m.groups())
        most = math.floor(free / total * 100) / 100
        return _Found(f"gpu-memory-utilization {util:g} asks for {asked:g} GiB but only {free:g} of {total:g} GiB "
                      "is free", f"lower gpu-memory-utilization to at most {most:.2f}, or free memory on the node",
                      f.evidence)
    return _Found(f"the engine ran out of memory while starting with {f.knob('gpu-memory-utilization')}: "
                  f"{_gist(f.evidence)}", f.remedy or "lower gpu-memory-utilization", f.evidence)


_KV_NEED = re.compile(r"max seq len \((\d+)\), \(([\d.]+) GiB KV cache is needed, which is larger than the "
                      r"available KV cache memory \(([\d.]+) GiB\)")
_FITS = re.compile(r"estimated maximum model length is (\d+)")


def _kv_too_small(f: _Facts, ctx: object) -> _Found | None:
    if f.failure != "kv_too_small":
        return None
    m, est = _KV_NEED.search(f.evidence), f.attrs.get("kv_estimate") or {}
    if m:
        cause = (f"max-model-len {m.group(1)} needs {m.group(2)} GiB of KV cache for one request; "
                 f"only {m.group(3)} GiB is available")
    elif f.predicted and "needed_tokens" in est:
        cause = (f"predicted before boot: {f.knob('max-model-len')} needs {est['needed_tokens']:,} KV tokens, the "
                 f"cache would hold {est.get('capacity_tokens', 0):,}")
    else:
        cause = f"{f.knob('max-model-len')} does not fit the KV cache: {_gist(f.evidence)}"
    fits = f.attrs.get("fits_max_model_len") or (int(m2.group(1)) if (m2 := _FITS.search(f.evidence)) else None)
    options = [f"lower max-model-len to at most {fits}" if fits else "lower max-model-len",
               "raise gpu-memory-utilization" + f.now("gpu-memory-utilization")]
    if ctx.fp8_kv and not str(f.knobs.get("kv-cache-dtype", "auto")).startswith("fp8"):
        options.append("use kv-cache-dtype fp8 (half the KV bytes per token)")
    return _Found(cause, ", or ".join(options), f.evidence)


_LOG_PREFIX = re.compile(r"^(?:\([^)]*\)\s+)?(?:[A-Z]+ \d\d-\d\d [\d:]+ \[[^\]]*\]\s+)?"
                         r"(?:[\w.]+(?:Error|Exception):\s+)?(?:Value error,\s+)?")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`])")


def _gist(line: str, limit: int = 200) -> str:
    """A log line's message: no process/level/source prefix or exception type, its first sentence."""
    text = _LOG_PREFIX.sub("", line.strip(), count=1).split(" [type=")[0]
    text = _SENTENCE_END.split(text, 1)[0]
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _float(x) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def _n(x: float | None) -> str:
    """A number as an operator reads it: 16, 0.3, 41.2, 1,234."""
    if x is None:
        return "?"
    if float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _flag(value) -> str:
    """A knob's value as it is written on the command line (config/flags.to_cli_args)."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def prefix_hits_without_speculation(study: optuna.Study) -> float | None:
    """The median prefix-cache hit rate of the measured trials that drafted nothing (None: no such trial)."""
    rates = sorted(rate for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
                   if "spec_acceptance" not in (server := of_trial.server(t))
                   and (rate := _float(server.get("prefix_cache_hit_rate"))) is not None)
    return rates[len(rates) // 2] if rates else None


# Mean time a request waited for a slot that counts as queuing: an idle server queues for
# ~0.03 ms (tests/fixtures/vllm_metrics), 50 ms is a visible share of a typical TTFT SLO.
QUEUED_MS = 50.0


def _queued(f: _Facts) -> bool:
    """Requests waited for a slot: a waiting peak, or a mean queue time of QUEUED_MS or more."""
    return (f.get("waiting_peak") or 0) > 0 or (f.get("queue_time_mean_ms") or 0) >= QUEUED_MS
