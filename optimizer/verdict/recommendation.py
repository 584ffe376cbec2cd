"""The one configuration a study recommends, and the one place every surface asks for it.

In order of trust: the minimal change (driver/minimal.py: the confirmed winner with every knob
that had no measurable effect put back), else the confirmed winner (the best re-measured mean),
else Optuna's best single run. The console, the written report, the study's note, `best.yaml`,
`/status`, the capacity plan, sensitivity and the daemon's warm starts all name this one.
optuna-dashboard's "Best Trial" badge cannot: it follows Optuna's best single value, and the
study's note says so when the two differ.

Its gain over the baseline is measured on both sides: the baseline is re-measured with the
winner (driver/confirm.py), and the 95% interval pools the noise of every repeated run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import optuna

from optimizer.measure.noise import geomean, ratio
from optimizer.record import of_trial, remeasured
from optimizer.verdict import confirmed

MINIMAL, CONFIRMED, SINGLE = "minimal change", "confirmed winner", "best single run"


@dataclass(frozen=True)
class Recommendation:
    trial: optuna.trial.FrozenTrial  # the trial it comes from (its metrics are the ones shown)
    args: tuple[str, ...]  # the vLLM flags to deploy
    values: tuple[float, ...]  # the objective's measured values of exactly these flags
    source: str  # MINIMAL, CONFIRMED or SINGLE
    rows: tuple[dict, ...] = ()  # what mattered: one row per knob the winner changed (measure/reversion.Row)
    combined: dict | None = None
    gain: dict | None = None  # {"ratio", "low", "high"} (>1 is better; low/high None without noise), "runs"
    run_dir: str | None = None  # where its first run's files are, under artifacts/<study>/ (None: its trial's)
    metrics: dict | None = None  # that run's metrics when they are not its trial's (the capacity plan reads them)

    @property
    def value(self) -> float:
        """The geometric mean of its runs (the centre every comparison uses: measure/noise.py)."""
        return geomean(self.values)

    @property
    def changed_from_trial(self) -> bool:
        """The minimal change put knobs back: the flags are not the trial's own."""
        return tuple(of_trial.vllm_args(self.trial)) != self.args


def minimal_record(study: optuna.Study, conf: remeasured.Confirmation | None = None) -> remeasured.MinimalChange | None:
    """The minimal-change record, if it was made for the current confirmation (same winner, same
    candidates, same repeats: a confirmation done again makes it stale)."""
    record = remeasured.read_minimal(study)
    return record if record.answers(conf if conf is not None else confirmed.read(study)) else None


def recommend(study: optuna.Study, conf: remeasured.Confirmation | None = None) -> Recommendation | None:
    """The study's recommendation (module docstring); None for a multi-objective study or when no
    trial completed within the SLOs. The confirmation (`conf`, when the caller has read it: verdict/
    confirmed.py read) and the minimal change are read once, as one snapshot."""
    if len(study.directions) > 1:
        return None
    try:
        best = study.best_trial  # with constraints: the best feasible one
    except ValueError:
        return None
    conf = conf if conf is not None else confirmed.read(study)
    minimal = remeasured.read_minimal(study)
    winner = conf.current_winner
    if minimal.answers(conf) and minimal.rows:  # no rows: the winner changed nothing from the baseline
        trial = study.trials[winner]
        final = minimal.final
        rec = Recommendation(trial, tuple(final["args"]), tuple(final["values"]), MINIMAL,
                             tuple(dict(r) for r in minimal.rows), dict(minimal.combined) if minimal.combined else None,
                             run_dir=final.get("dir"), metrics=final.get("metrics") if final.get("dir") else None)
    elif winner is not None:
        trial = study.trials[winner]
        rec = Recommendation(trial, tuple(of_trial.vllm_args(trial)), tuple(conf.values(winner)), CONFIRMED)
    else:
        rec = Recommendation(best, tuple(of_trial.vllm_args(best)), (best.value,), SINGLE)
    return _with_gain(study, rec, conf, confirmed.pooled_noise(conf, minimal))


def baseline_values(study: optuna.Study, conf: remeasured.Confirmation) -> list[float]:
    """The baseline's measured values: its trial's, and its re-measurements when confirmation made them."""
    base = confirmed.baseline_trial(study)
    if base is None or base.state != optuna.trial.TrialState.COMPLETE or base.value is None:
        return []
    return conf.values(base.number) or [base.value]


def _with_gain(study: optuna.Study, rec: Recommendation, conf: remeasured.Confirmation, noise) -> Recommendation:
    base = baseline_values(study, conf)
    if not base or min(base) <= 0 or min(rec.values) <= 0:
        return rec
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    point = geomean(rec.values) / geomean(base)
    g = {"ratio": point if maximize else 1 / point, "low": None, "high": None,
         "runs": [len(rec.values), len(base)], "baseline": geomean(base)}
    if noise is not None:
        r = ratio(rec.values, base, noise)  # recommended / baseline, geometric
        g.update(ratio=r.ratio, low=r.low, high=r.high) if maximize else \
            g.update(ratio=1 / r.ratio, low=1 / r.high, high=1 / r.low)
    return replace(rec, gain=g)
