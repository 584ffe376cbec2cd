"""The twin as the search's prior (`search.prior: twin`), never its last word.

Every configuration the sampler or screening proposes is simulated first by the twin calibrated
on the study's own runs (twin/from_study.py: the baseline's run, then the first run of the other KV
dtype; refitted when that set changes), and scored by the study's objective. The prediction is
stored on the trial (`prior`) and said on the console.

Each prediction is anchored on the baseline's real run (`anchored`): the twin's value times the
baseline's measured value over the twin's value for the baseline, so an error the twin makes
alike on every configuration of this workload cancels. Its band is the twin's own error on this
study: |log(predicted / measured)| of the trials it predicted before they booted (the largest of
them below 10, else their 90th percentile), never under `FLOOR`. Until `MIN_RESIDUALS` trials have
been predicted and measured, the band is the one validated on real runs for a twin calibrated on
one run (twin/prediction.py `BAND_ONE_RUN`, the objective's metric), and only while the twin
reproduces the baseline's own run within that band; a twin that does not (its step costs 2x off)
is not trusted until its residuals say so, and can only change which configuration boots next.

A configuration whose prediction, at the favourable end of that band, is still worse than the best
feasible value measured is told PRUNED as `predicted_to_lose` ("predicted, not booted: ..."),
without a boot. One the twin schedules exactly as a measured one (the same steps and metrics: a
larger KV pool that never fills, a max-model-len no request reaches, on a CPU 64 sequences where
32 are ever in flight), differing from it only in knobs that change nothing but the scheduler's
limits (`SAME_KNOBS`), is told PRUNED as `predicted_same` once the band is known: booting it
would measure that trial's noise. A screening move is compared with the baseline only. Being PRUNED, neither is ever the recommendation, a
re-measurement's candidate, a reversion's evidence or the baseline; screening holds such a knob.
A configuration outside the twin's validated envelope (an uncalibrated KV dtype, parallel ranks,
speculation, an attention backend, max-num-seqs far from the calibration's) is always booted; one
outside only for running a larger batch than any calibration run held is never predicted to lose
(that batch's price is extrapolated), but may be predicted the same as a trial the twin schedules
step for step alike, both priced alike whatever that price.

Screening's moves are queued in the twin's predicted order, best first (`order`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from optimizer.errors import OptimizerError
from optimizer.record import of_trial
from optimizer.verdict.trials import COMPLETE

MIN_RESIDUALS = 3
FLOOR = 0.05  # a band never narrower than 5%: single runs move more than that here


def metric_of(objective) -> str:
    """The summarize() key an objective scores ('ttft_p95' -> 'ttft_ms_p95'; throughputs as named)."""
    m = str(objective.metric or "")
    if objective.name == "latency":
        base, _, pct = m.rpartition("_")
        return f"{base}_ms_{pct}"
    return m


@dataclass(frozen=True)
class Predicted:
    """The twin's value of the objective for one configuration, and where that leaves it."""

    value: float
    calibrated_on: tuple[int, ...]
    outside: tuple[str, ...] = ()  # why the configuration is outside the validated envelope
    raw: float | None = None  # the twin's own value, before anchoring on the baseline
    anchor_error: float | None = None  # |log(twin's baseline / measured baseline)|
    schedule: str = ""  # a digest of the simulated run (its steps and every metric): equal, the same schedule

    def as_dict(self) -> dict:
        return {**asdict(self), "calibrated_on": list(self.calibrated_on), "outside": list(self.outside)}


def residuals(study) -> list[float]:
    """|log(predicted / measured)| of every complete, fully measured trial the twin predicted before it booted."""
    out = []
    for t in study.get_trials(deepcopy=False, states=(COMPLETE,)):
        p = of_trial.prior(t).get("value")
        if p and t.value and p > 0 and t.value > 0 and not of_trial.value_from_partial_run(t):
            out.append(abs(math.log(p / t.value)))
    return out


def band(study, plan=None, pred: Predicted | None = None) -> float | None:
    """The twin's band on this study as a factor - 1 (0.2: 20%): its residuals once MIN_RESIDUALS
    trials say, before that the validated one-run band of the objective's metric where the twin
    reproduces the baseline's run within it (`pred`'s anchor error); None: not known."""
    r = sorted(residuals(study))
    if len(r) >= MIN_RESIDUALS:
        e = r[-1] if len(r) < 10 else r[int(0.9 * (len(r) - 1))]
        return max(FLOOR, math.expm1(e))
    from optimizer.twin.prediction import BAND_ONE_RUN  # noqa: PLC0415

    validated = BAND_ONE_RUN.get(metric_of(plan.objective)) if plan is not None else None
    if validated is None or pred is None or pred.anchor_error is None or pred.anchor_error > math.log1p(validated):
        return None
    return max(FLOOR, validated, math.expm1(r[-1]) if r else 0.0)  # never narrower than an error already seen


# Knobs that change nothing but the scheduler's limits: where the twin schedules two configurations
# step for step alike, the engine runs the same batches. On a GPU, max-num-seqs and the token budget
# also size the CUDA graphs captured (a different speed for the same batches): CPU only.
SAME_KNOBS = ("gpu-memory-utilization", "max-model-len")
SAME_KNOBS_CPU = ("max-num-seqs", "max-num-batched-tokens")


def same_schedule(study, plan, pred: Predicted, params: dict, base: Predicted | None, only_baseline: bool):
    """The fully measured trial (the baseline first) the twin schedules exactly as `pred`, differing
    from `params` only in SAME_KNOBS; None if there is none. `base`: the twin's run of the baseline."""
    from optimizer.search.screening import measured_baseline  # noqa: PLC0415
    from optimizer.twin.envelope import beyond_price  # noqa: PLC0415

    # A batch past the calibration's doubts a step's price only, and both sides are priced alike.
    if beyond_price(pred.outside) or not pred.schedule:
        return None
    found = []
    if (b := measured_baseline(study)) is not None and base is not None and not beyond_price(base.outside):
        found += [b] if base.schedule == pred.schedule else []
    if not only_baseline:
        found += [t for t in study.get_trials(deepcopy=False, states=(COMPLETE,))
                  if of_trial.prior(t).get("schedule") == pred.schedule
                  and not beyond_price(of_trial.prior(t).get("outside")) and not of_trial.value_from_partial_run(t)]
    safe = set(SAME_KNOBS) | (set(SAME_KNOBS_CPU) if plan.device.kind == "cpu" else set())
    for t in found:
        ran = {**(plan.cfg.baseline or {}), **t.params}  # the knobs it ran: the baseline's, then its own draws
        if {k for k in set(params) | set(ran) if str(params.get(k)) != str(ran.get(k))} <= safe:
            return t
    return None


def anchored(pred: Predicted, base: Predicted | None, measured: float | None) -> Predicted:
    """`pred` times the baseline's measured value over the twin's value for the baseline."""
    from optimizer.twin.envelope import beyond_price  # noqa: PLC0415

    if base is None or beyond_price(base.outside) or not measured or not base.value or base.value <= 0 \
            or measured <= 0:
        return pred
    return replace(pred, value=pred.value * measured / base.value, raw=pred.value,
                   anchor_error=abs(math.log(base.value / measured)))


def loses(pred: Predicted, best: float | None, maximize: bool, e: float | None) -> str | None:
    """Why `pred` cannot win against `best` even at its band's favourable end; None: boot it."""
    if e is None or best is None or pred.outside or not pred.value > 0:
        return None
    favourable = pred.value * (1 + e) if maximize else pred.value / (1 + e)
    if (favourable < best) if maximize else (favourable > best):
        return (f"predicted, not booted: the twin puts it at {pred.value:.4g} ({favourable:.4g} at best, "
                f"its band +-{e:.0%}), and {best:.4g} is measured")
    return None


def predict(plan, params: dict, runs=None) -> Predicted | None:
    """The objective's value the twin predicts for `params` (None: the twin cannot answer here);
    `runs`: the study's stored runs, when the caller has read them already."""
    from optimizer.twin import envelope  # noqa: PLC0415
    from optimizer.twin.from_study import calibrate, stored_runs  # noqa: PLC0415
    from optimizer.twin.prediction import predict as scored  # noqa: PLC0415
    from optimizer.twin.server import TwinServer  # noqa: PLC0415

    try:
        cal = calibrate(plan, stored_runs(plan.artifacts) if runs is None else runs)
        server = TwinServer.from_flags(plan.model, plan.server_args(params), plan.device, "", cal.kv_calibration)
        sim = server.run(plan.workload.requests, plan.workload.concurrency, cal.cost)
        got = scored(sim, plan.objective.slos)
        value = plan.objective.score(got.metrics)
        # the study's own workload at its own rate: only the flags can leave the envelope
        outside = envelope.outside(server.shape, [s.shape for s in cal.servers], params,
                                   batch=sim.server["running_peak"], calibrated_batch=cal.largest_batch)
    except (OptimizerError, ValueError, KeyError, RuntimeError):  # no run to calibrate on, flags it cannot model
        return None
    return Predicted(float(value), tuple(r.number for r in cal.runs), tuple(outside), schedule=_digest(got))


def _digest(got) -> str:
    """The simulated run in a few bytes: its step count and every metric (equal: the same schedule)."""
    import hashlib  # noqa: PLC0415

    figures = sorted((k, round(v, 9)) for k, v in got.metrics.items() if isinstance(v, (int, float)))
    return hashlib.sha1(repr((got.steps, figures, got.goodput)).encode()).hexdigest()[:16]


def order(plan, moves: list[tuple[str, object]], baseline: dict) -> list[tuple[str, object]]:
    """Screening's moves, the best predicted first (moves the twin cannot predict keep their place, last)."""
    from optimizer.twin.from_study import stored_runs  # noqa: PLC0415

    maximize = plan.objective.direction == "maximize"
    runs = stored_runs(plan.artifacts)  # read once for every move
    keyed = []
    for i, (knob, value) in enumerate(moves):
        p = predict(plan, {**baseline, knob: value}, runs)
        rank = math.inf if p is None else (-p.value if maximize else p.value)
        keyed.append((rank, i, (knob, value)))
    return [move for _, _, move in sorted(keyed)]
