"""Capacity planning: the best configuration's measured rate -> the replicas and GPUs a peak load needs
(report/capacity.py says it in lines).

`python -m optimizer plan --peak-qps 50 --tokens-per-request 2000` asks how many replicas of the
study's best configuration (the confirmed winner when re-measured) carry 50 req/s of 2000 tokens
each (prompt + output: 100k tokens/s), keeping `--headroom` of every replica free.

A replica's measurement is one run seen two ways: its request rate and its total token rate (prompt
+ output, counted like the demand; output tokens/s alone would undercount a prompt-heavy load),
linked by the run's mean tokens/request. Requests heavier than measured bind on tokens/s; lighter
ones bind on req/s (a replica is never assumed to carry more requests/s than it was seen to). The
plan takes the larger replica count and shows both.

The rate a plan rests on:
- goodput study: `goodput_rate`, the highest req/s at which every SLO held (SLO-bounded). Not
  `goodput_output_throughput` (output tokens only), nor `goodput_rps` (requests that each met every
  SLO: a p95 SLO lets 5% miss, and the replica still carries them).
- any other study: the run's `total_token_throughput`; SLO-bounded when the run met the study's SLO
  constraints. Without SLOs it is the rate at saturation (or at the workload's schedule): latency
  at that load is not promised, and the plan says so.
A re-measured trial's mean (driver/confirm.py) replaces its one run when the objective is a rate: the
workload fixes the ratios between a run's rates, so they all scale with the objective's value.
`--slo` asks for SLOs the study did not bound: they are checked against the measured run's
latencies, and a miss is refused (no plan can promise it without measuring again).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from optimizer.config import topology
from optimizer.config.flags import PARALLEL_SHORT, named_flags
from optimizer.errors import ConfigError
from optimizer.fleet.scaling import Scaling, for_trial
from optimizer.measure.slo import Slo
from optimizer.measure.slo import describe as describe_slos
from optimizer.record import of_study, of_trial
from optimizer.verdict import confirmed
from optimizer.verdict.recommendation import recommend
from optimizer.verdict.trials import COMPLETE

RATE_OBJECTIVES = ("goodput_rate", "output_throughput", "total_token_throughput", "request_throughput")
EXTRAPOLATION = 2.0  # planned vs measured tokens/request beyond this factor either way: warned


@dataclass(frozen=True)
class Measurement:
    """What one replica of a configuration was measured to carry."""

    trial: int
    metric: str  # the metric the plan rests on
    value: float  # per replica, in `unit`
    unit: str  # "req/s" or "tokens/s"
    tokens_per_request: float  # the measured workload's mean, prompt + output
    slo_bounded: bool = False
    slos: str = ""  # the SLOs as text ("" without any)
    tensor_parallel_size: int = 1
    gpus_per_replica: int = 1  # tensor x pipeline x data parallel sizes
    runs: int = 1  # > 1: the mean of the trial's re-measurements
    other_runs: int = 0  # re-measurements of another metric (a latency objective's): not the rate
    device: str = ""  # what the study ran on (cpu | gpu), when it recorded it
    other_metric: str = "latency"  # what those re-measurements measured

    @property
    def remeasured(self) -> bool:
        return self.runs > 1

    @property
    def requests_per_s(self) -> float:
        return self.value if self.unit == "req/s" else self.value / self.tokens_per_request

    @property
    def tokens_per_s(self) -> float:
        return self.value if self.unit == "tokens/s" else self.value * self.tokens_per_request


@dataclass(frozen=True)
class Plan:
    measurement: Measurement
    peak_qps: float
    tokens_per_request: float
    headroom: float
    replicas_for_requests: int
    replicas_for_tokens: int
    warnings: tuple[str, ...] = ()
    scaling: Scaling | None = None  # measured together behind a proxy (fleet/scaling.py); None: assumed 1.0
    scaled_by: float = 1.0  # the factor the scaling put on each replica's rate (1.0: one replica, or none measured)

    @property
    def demand_tokens_per_s(self) -> float:
        return self.peak_qps * self.tokens_per_request

    @property
    def replicas(self) -> int:
        return max(self.replicas_for_requests, self.replicas_for_tokens)

    @property
    def gpus(self) -> int:
        return self.replicas * self.measurement.gpus_per_replica

    @property
    def binding(self) -> str:
        """The constraint that sets the replica count: "req/s", "tokens/s" or "both"."""
        if self.replicas_for_requests == self.replicas_for_tokens:
            return "both"
        return "req/s" if self.replicas_for_requests > self.replicas_for_tokens else "tokens/s"


def check_inputs(peak_qps: float, tokens_per_request: float, headroom: float) -> None:
    """Raise ConfigError naming the first bad flag and its fix."""
    if not (math.isfinite(peak_qps) and peak_qps > 0):
        raise ConfigError(f"--peak-qps {peak_qps:g}: give the peak request rate as a positive number, e.g. 50")
    if not (math.isfinite(tokens_per_request) and tokens_per_request > 0):
        raise ConfigError(f"--tokens-per-request {tokens_per_request:g}: give the mean prompt + output tokens "
                          "per request as a positive number, e.g. 2000")
    if not 0 <= headroom < 1:
        raise ConfigError(f"--headroom {headroom:g}: give the share of each replica kept free, from 0 up to "
                          "(not including) 1, e.g. 0.3")


def plan(measurement: Measurement, peak_qps: float, tokens_per_request: float, headroom: float = 0.3,
         scaling: Scaling | None = None) -> Plan:
    """Replicas (and GPUs) of the measured configuration for `peak_qps` requests/s of
    `tokens_per_request` tokens each, every replica loaded to (1 - headroom) of its measured rate,
    times the measured `scaling` once there is more than one replica (at most 1.0: a fleet is never
    planned to carry more than its replicas alone); raises ConfigError for a bad input."""
    check_inputs(peak_qps, tokens_per_request, headroom)
    usable = 1 - headroom
    m = measurement
    counts = (_replicas(peak_qps, m.requests_per_s * usable), _replicas(peak_qps * tokens_per_request,
                                                                         m.tokens_per_s * usable))
    factor = min(1.0, scaling.efficiency) if scaling is not None and max(counts) > 1 else 1.0
    if factor != 1.0:
        counts = (_replicas(peak_qps, m.requests_per_s * usable * factor),
                  _replicas(peak_qps * tokens_per_request, m.tokens_per_s * usable * factor))
    return Plan(m, peak_qps, tokens_per_request, headroom, *counts, _warnings(m, tokens_per_request), scaling, factor)


def _replicas(demand: float, per_replica: float) -> int:
    # rounded first: 3000 / (3000 * (1 - 0.9)) is 10.000000000000002 in floats, and 10 replicas suffice
    return max(1, math.ceil(round(demand / per_replica, 9)))


def _warnings(m: Measurement, tokens_per_request: float) -> tuple[str, ...]:
    out = []
    ratio = tokens_per_request / m.tokens_per_request
    if ratio > EXTRAPOLATION or ratio < 1 / EXTRAPOLATION:
        out.append(f"the plan extrapolates: measured on {rounded(m.tokens_per_request)} tokens/request, planned for "
                   f"{rounded(tokens_per_request)} ({ratio:.2g}x); run the study on a workload of that size to be sure")
    if not m.slo_bounded:
        out.append(f"trial {m.trial} missed its SLOs ({m.slos}): latency at this load is not promised" if m.slos else
                   "throughput at saturation, not under SLOs: latency at this load is not promised "
                   "(give the study SLOs, or check them here with --slo)")
    if m.device == "cpu":
        out.append("measured on CPU: a GPU replica's rate is not this one; run the study on the target GPU")
    return tuple(out)


def rounded(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def measurement_from_study(study, trial_number: int | None = None,
                           slos: tuple[Slo, ...] = ()) -> Measurement:
    """What a replica of the study's recommended configuration carries (verdict/recommendation.py: the
    minimal change's own run when it changed the winner's flags, else the winner's trial), or of trial
    `trial_number`; with `slos` (--slo),
    only if the measured run met them. Raises ConfigError naming the problem and the fix."""
    trial = _pick(study, trial_number)
    rec = recommend(study) if trial_number is None else None
    own = bool(rec is not None and rec.changed_from_trial and rec.metrics)  # the minimal change's own run
    metrics = rec.metrics if own else of_trial.metrics(trial)
    total, requests = _positive(metrics, "total_token_throughput"), _positive(metrics, "request_throughput")
    if total is None or requests is None:
        raise ConfigError(f"trial {trial.number} recorded no total_token_throughput and request_throughput: "
                          "nothing to plan on; name a trial that measured them with --trial N")
    objective = of_study.objective(study).partition(" slos ")
    study_slos = objective[2]
    if "goodput_rate" in metrics:
        metric, value, unit = "goodput_rate", _positive(metrics, "goodput_rate"), "req/s"
        if value is None:
            named = f" ({study_slos})" if study_slos else ""
            raise ConfigError(f"trial {trial.number} held the SLOs{named} at no request rate: no capacity to "
                              "plan on; relax the SLOs, or name another trial with --trial N")
        bounded, text = True, study_slos or "of the study"
    else:
        metric, value, unit = "total_token_throughput", total, "tokens/s"
        constraints = trial.constraints or {}
        bounded = bool(constraints) and all(v <= 0 for v in constraints.values())
        text = study_slos or ", ".join(sorted(constraints))
    if slos:
        _check_slos(trial.number, slos, metrics)
        text = "; ".join(t for t in (text if bounded else "", describe_slos(slos)) if t)
        bounded = True
    value, runs, other_runs = (value, 1, 0) if own else _remeasured(study, trial, value,
                                                                     objective[0].partition(":")[2])
    tp, gpus = parallel_sizes(list(rec.args) if own else of_trial.vllm_args(trial), trial.params)
    return Measurement(trial.number, metric, value, unit, total / requests, bounded, text, tp, gpus, runs,
                       other_runs, of_study.device(study),
                       objective[0].partition(":")[2].split(" ")[0] or "latency")


def _pick(study, number: int | None):
    trials = study.get_trials(deepcopy=False)
    name = study.study_name
    if number is not None:
        if not 0 <= number < len(trials):
            raise ConfigError(f"--trial {number}: study '{name}' has trials 0 to {len(trials) - 1}; pick one of them")
        if trials[number].state != COMPLETE:
            raise ConfigError(f"--trial {number}: it is {trials[number].state.name}, not measured to the end; "
                              "pick a COMPLETE trial")
        return trials[number]
    if len(study.directions) > 1:
        raise ConfigError(f"study '{name}' is multi-objective: its Pareto front has no single best; pick a front "
                          "member with --trial N (see pareto_front.yaml)")
    if not any(t.state == COMPLETE for t in trials):
        raise ConfigError(f"study '{name}' has no completed trial: nothing measured to plan on; run "
                          "`python -m optimizer run` until one completes")
    try:
        best = study.best_trial  # with constraints: the best feasible one
    except ValueError:
        raise ConfigError(f"study '{name}': no trial met the SLOs, so none is safe to plan on; relax the SLOs, "
                          "or name a trial with --trial N") from None
    rec = recommend(study)  # the one the study recommends (verdict/recommendation.py)
    return rec.trial if rec is not None else best


def _positive(metrics: dict, key: str) -> float | None:
    value = metrics.get(key)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value > 0 else None


def _check_slos(number: int, slos: tuple[Slo, ...], metrics: dict) -> None:
    """The measured run met every asked SLO at the load the plan rests on; else ConfigError."""
    for s in slos:
        observed = s.observed(metrics)
        if observed is None or not math.isfinite(observed):
            recorded = sorted(k.split("_ms_")[1] for k in metrics if k.startswith(f"{s.metric}_ms_p"))
            raise ConfigError(f"--slo {s}: trial {number} recorded no {s.key}; use a percentile it recorded "
                              f"({', '.join(recorded) or 'none'})")
        if s.excess(metrics) > 0:
            unit = "%" if s.metric == "error" else " ms"
            raise ConfigError(f"--slo {s}: trial {number} measured {observed:.4g}{unit} at the load the plan rests "
                              "on, so no plan from this study can promise it; run the study with this --slo")


def _remeasured(study, trial, value: float,
                objective_metric: str) -> tuple[float, int, int]:
    """`value` scaled to the trial's re-measured mean (driver/confirm.py), the runs behind it, and the
    re-measured runs of a latency objective (they say nothing about the rate: not used, but counted)."""
    ci = confirmed.read(study).interval(trial.number)
    runs = int((ci or {}).get("n") or 1)
    if not ci or runs < 2 or not trial.value:
        return value, 1, 0
    if objective_metric not in RATE_OBJECTIVES:
        return value, 1, runs  # a latency mean says nothing about the rate
    return value * ci["mean"] / trial.value, runs, 0


def parallel_sizes(args: list[str], params: dict) -> tuple[int, int]:
    """(tensor-parallel size, GPUs per replica) from the vLLM flags deployed; from the trial's parameters
    only when no flags were recorded (a minimal change that put TP back leaves it in the winner's
    parameters, not in the flags it deploys)."""
    flags = named_flags(args)
    sizes = {}
    for name in PARALLEL_SHORT.values():
        try:
            sizes[name] = max(1, int(flags.get(name, 1) if args else params.get(name, 1)))
        except (TypeError, ValueError):
            sizes[name] = 1
    return sizes["tensor-parallel-size"], math.prod(sizes.values())




def topology_plans(study, slos: tuple[Slo, ...], peak_qps: float, tokens_per_request: float,
                   headroom: float, study_slos: tuple[Slo, ...] = ()) -> list[tuple[str, Plan, str]]:
    """For each topology the study measured (its parallel sizes), the plan on its trial that needs the
    fewest devices: (label, plan, the room its tightest SLO had at the rate planned on, `slos` or else
    the study's own); fewest devices first. A trial nothing can be planned on (no rate held the SLOs,
    a `--slo` it missed) is left out."""
    best: dict[str, tuple] = {}
    for t in study.get_trials(deepcopy=False, states=(COMPLETE,)):
        if of_trial.is_repeat(t):
            continue
        given = named_flags([str(a) for a in of_trial.vllm_args(t)])
        sizes = {name: given.get(name, t.params.get(name, 1)) for name in PARALLEL_SHORT.values()}
        label = topology.label({k: int(v) for k, v in sizes.items()})
        try:
            p = plan(measurement_from_study(study, t.number, slos), peak_qps, tokens_per_request, headroom,
                     for_trial(study, t.number))
        except ConfigError:
            continue
        key = (p.gpus, -p.measurement.value)
        if label not in best or key < best[label][0]:
            best[label] = (key, p, _slo_room(slos or study_slos, of_trial.metrics(t)))
    return [(label, p, room) for label, (_, p, room) in sorted(best.items(), key=lambda kv: kv[1][0])]


def _slo_room(slos: tuple[Slo, ...], metrics: dict) -> str:
    """'TTFT 47% under its limit' for the tightest SLO at the measured rate; '' without SLOs."""
    if not slos:
        return ""
    tight = max(slos, key=lambda s: s.excess(metrics))
    excess = tight.excess(metrics)
    if not math.isfinite(excess):
        return f"{tight.metric.upper()} p{tight.percentile} not measured"
    return f"{tight.metric.upper()} p{tight.percentile} {abs(excess):.0%} {'over' if excess > 0 else 'under'} its limit"
