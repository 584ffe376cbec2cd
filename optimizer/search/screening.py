"""The screening phase's moves: each knob moved alone from the baseline, queued once its value is in,
and the knobs screening holds let go once the sampler has nothing new to try among the others.

The moves (`screening_moves`), the operator's one-variable-at-a-time method: a numeric knob
doubles (a log range) or moves by a quarter of its range, upward unless that leaves the range;
a categorical knob takes the next choice; a switch flips. The value is rounded as an operator
writes it (config/round_values.py). A knob the baseline leaves to vLLM has no value to move
from: it is not screened (the sampler searches it). What the moves found, and which knobs they
hold, is verdict/screening.py's. Once the sampler proposes RELEASE_AFTER measured configurations
in a row among the knobs it moves (it has nothing new to try there), every knob is released: the
rest of the budget searches them all.
"""

from __future__ import annotations

import optuna

from optimizer.config.round_values import round_draw
from optimizer.record import of_study, of_trial
from optimizer.search.convergence import repeat_streak
from optimizer.verdict.confirmed import baseline_trial
from optimizer.verdict.screening import held, screening
from optimizer.verdict.trials import COMPLETE, feasible, finished_count

RELEASE_AFTER = 4  # repeats in a row (half of CONVERGED_AFTER: the search goes on after)


def moved(value, dim) -> object | None:
    """The knob's value one step away from `value` within its dimension (None: nowhere to go)."""
    if dim.choices is not None:
        choices = list(dim.choices)
        if len(choices) < 2:
            return None
        i = choices.index(value) if value in choices else -1
        return choices[(i + 1) % len(choices)]
    low, high = dim.low, dim.high
    if dim.knob.kind == "bool":
        return not value
    if dim.log:
        up, down = value * 2, value / 2
    else:
        step = (high - low) / 4
        up, down = value + step, value - step
    new = up if up <= high else down
    if new < low:
        return None
    return int(round(new)) if dim.knob.kind == "int" else round(new, 2)


def screening_moves(baseline: dict, space) -> list[tuple[str, object]]:
    """[(knob, moved value)], one per knob of `space` the baseline sets, in the space's order."""
    out = []
    for d in space.dims:
        name = d.knob.name
        if baseline.get(name) is None:
            continue
        new = moved(baseline[name], d)
        if new is not None and d.choices is None:
            new = round_draw(name, new, d.low, d.high, space.block, d.ladder)
        if new is not None and new != baseline[name]:
            out.append((name, new))
    return out


def queue_screening(study: optuna.Study, screen: bool, n_trials: int, baseline: dict, space,
                    ordered=None) -> None:
    """With `screen` (search.screen), once the baseline has a value within the SLOs: queue each knob
    moved alone from it, after the configured warm starts, as many as the budget (`n_trials`) has
    room for. A baseline that missed the SLOs is no configuration to stay near: no screening.
    Once per study; not in a study the sampler drew for after the baseline's value came (one made
    before screening), though draws started beside the baseline (parallel slots) do not count.
    `ordered(moves)`, when given, puts the moves in the order to boot them (search/prior.py's)."""
    trials = study.get_trials(deepcopy=False)
    if not screen or of_study.screening_queued(study):
        return
    base = measured_baseline(study)
    if base is None:
        return
    if any(not of_trial.queued(t) and t.datetime_start and t.datetime_start > base.datetime_complete for t in trials):
        return
    pending = sum(1 for t in trials if not t.state.is_finished())
    room = n_trials - finished_count(study) - pending
    if room <= 0:
        return
    moves = screening_moves(baseline, space)
    moves = ordered(moves) if ordered is not None else moves  # before the mark: the twin may take seconds
    of_study.mark_screening_queued(study)  # first: an interruption must not queue the moves twice
    for knob, value in moves[:room]:
        of_trial.enqueue_screen(study, {**baseline, knob: value}, knob)


def measured_baseline(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """The baseline trial once it has a value within the SLOs (verdict/confirmed.py finds it)."""
    base = baseline_trial(study)
    return base if base is not None and base.state == COMPLETE and feasible(base) else None


def newly_screened(study: optuna.Study) -> dict | None:
    """What screening found (verdict/screening.py), stored on the study the first time it is
    complete; None before that and after."""
    found = screening(study)
    if found is None or of_study.has_screening(study):
        return None
    of_study.write_screening(study, found)
    return found


def released(study: optuna.Study, n_trials: int) -> set[str]:
    """The held knobs let go now, after RELEASE_AFTER repeats in a row under this budget (stored on
    the study); empty when nothing is held or the sampler still finds new configurations."""
    kept = held(study)
    if kept and repeat_streak(study, n_trials) >= RELEASE_AFTER:
        of_study.mark_screening_released(study, len(study.trials))
        return kept
    return set()
