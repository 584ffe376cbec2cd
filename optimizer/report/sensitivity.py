"""One-factor sensitivity: the best configuration re-measured with one knob moved at a time, the
single-variable experiment operators run by hand, each effect shown against the noise band.

The band is where one more run of the best configuration itself lands 95% of the time: on the
one scale every comparison uses (measure/noise.py), the geometric mean of every measurement of it
(the search's run, the confirmation's re-measurements, and `repeats` more taken here) times
exp(+- t s sqrt(1 + 1/n)), with s the noise of one run pooled over every repeated run of the
study. A moved knob, measured once, whose value falls inside the band did nothing measurable
on this machine.

A knob moves one step from the best's value: a numeric knob doubles (a log range) or moves by a
quarter of its range, upward unless that leaves the range; a categorical knob takes the next
choice. `--to knob=value` picks the value instead. Each run is a full measurement (no early
stop), stored under `artifacts/<study>/sensitivity/<knob>/`; the results go to the study's
`sensitivity` user attribute (the report shows them).
"""

from __future__ import annotations

import optuna

from optimizer.config.flags import from_cli_args
from optimizer.verdict.screening import moved
from optimizer.config.space import SearchSpace, active
from optimizer.errors import ConfigError
from optimizer.measure.noise import Estimate, estimate, pooled
from optimizer.record import remeasured
from optimizer.verdict.recommendation import recommend
from optimizer.verdict.trials import knobs_of

KEY = 2_000_000  # board keys of these runs: no trial or confirmation reaches them


def best_trial(study: optuna.Study) -> optuna.trial.FrozenTrial:
    if len(study.directions) > 1:
        raise ConfigError("sensitivity: a Pareto study has no single best; it applies to single-objective studies")
    rec = recommend(study)  # the one the study recommends (verdict/recommendation.py)
    if rec is not None:
        return rec.trial
    try:
        return study.best_trial
    except ValueError:
        raise ConfigError(f"sensitivity: study '{study.study_name}' has no completed trial that met its SLOs; "
                          "run the study first") from None


def moves(params: dict, space: SearchSpace, knobs: list[str] | None = None, to: dict | None = None) -> list[tuple]:
    """[(knob, from, to)] for each knob of the space (or of `knobs`) active in `params`."""
    to = to or {}
    dims = {d.knob.name: d for d in space.dims}
    wanted = knobs or [n for n in dims if active(n, params)]
    out = []
    for name in wanted:
        if name not in dims:
            raise ConfigError(f"sensitivity: '{name}' is not a knob of this study's space ({', '.join(dims)}); "
                              "pass one of those")
        current = params.get(name)
        if current is None:
            continue
        new = to.get(name, moved(current, dims[name]))
        if new is not None and new != current:
            out.append((name, current, new))
    for name in to:
        if name not in wanted:
            raise ConfigError(f"sensitivity: --to {name}=... names a knob not being moved; add it to --knobs")
    return out


def band(values: list[float], groups=()) -> Estimate:
    """Where one more run of the best lands 95% of the time (module docstring), its noise pooled
    over `values` and the study's other repeated runs (`groups`). No repeats anywhere: no band
    (None bounds)."""
    return estimate(-1, values, pooled([values, *groups]), one_run=True)


def effect(name: str, old, new, value: float | None, noise: Estimate, maximize: bool) -> dict:
    """One moved knob's row: its value, its ratio to the best's mean (> 1: better), and whether it
    left the noise band."""
    row = {"knob": name, "from": old, "to": new, "value": value, "n": len(noise.values),
           "band_low": noise.low, "band_high": noise.high, "best_mean": noise.mean}
    if value is None:
        return {**row, "ratio": None, "verdict": "failed"}
    ratio = None
    if noise.mean and (value or maximize):  # a zero latency has no ratio; a zero throughput has 0
        ratio = value / noise.mean if maximize else noise.mean / value
    better = (value > noise.mean) == maximize
    if noise.low is None:
        return {**row, "ratio": ratio, "verdict": ("better" if better else "worse") + " (no band: nothing measured twice)"}
    inside = noise.low <= value <= noise.high
    verdict = "within noise" if inside else ("better" if better else "worse")
    return {**row, "ratio": ratio, "verdict": verdict}


def prepare_run(study: optuna.Study, plan, knobs=None, to=None) -> tuple[optuna.trial.FrozenTrial, dict, list]:
    """The best trial, its full parameters and the planned moves; raises ConfigError (before any boot)."""
    best, rec = best_trial(study), recommend(study)
    # The recommendation's knobs as it was measured (the minimal change's, rounded values included).
    base = from_cli_args(list(rec.args)) if rec is not None else knobs_of(best)
    planned = moves(base, plan.space, knobs, to)
    if not planned:
        raise ConfigError("sensitivity: no knob to move (each is fixed or has one value in the space); widen the space")
    return best, base, planned


def run(study: optuna.Study, plan, progress, measure, prepared, repeats: int = 0) -> list[dict]:
    """Measure the best once more `repeats` times, then each move once; `measure(params, key,
    log_dir)` runs one full measurement (driver/measure_once.measure_once) and returns its value or None. The
    rows are stored on the study after each move: an interruption loses one run at most."""
    best, base, planned = prepared
    rec = recommend(study)
    values = list(rec.values) if rec is not None and rec.trial.number == best.number else [best.value]
    progress.console.print(f"[bold]Sensitivity[/] of trial {best.number} ({len(planned)} knob(s), "
                           f"{repeats} extra run(s) of the best for its noise band)")
    for k in range(repeats):
        value = measure(base, KEY + k, f"sensitivity/best-{k}")
        if value is not None:
            values.append(value)
        progress.console.print(f"  best again: {value if value is None else round(value, 2)}")
    noise = band(values, remeasured.every_values(remeasured.confirmation(study), but=best.number))
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    record = []
    for i, (name, old, new) in enumerate(planned):
        value = measure({**base, name: new}, KEY + 100 + i, f"sensitivity/{name}")
        record.append({**effect(name, old, new, value, noise, maximize), "trial": best.number})
        progress.console.print(f"  {name} {old} -> {new}: {describe(record[-1], plan.objective.unit)}")
        remeasured.write_sensitivity(study, record)
    return record


def describe(row: dict, unit: str) -> str:
    if row["value"] is None:
        return "the run failed (see its server.log)"
    band_text = (f"band [{row['band_low']:.2f}, {row['band_high']:.2f}]" if row["band_low"] is not None
                 else "no band")
    ratio = f"{row['ratio']:.2f}x" if row["ratio"] is not None else "no ratio to"
    return f"{row['value']:.2f} {unit} ({ratio} the best's mean {row['best_mean']:.2f}; {band_text}): " \
           f"{row['verdict']}"

