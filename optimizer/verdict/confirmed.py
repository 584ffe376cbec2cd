"""What a confirmation says: the top configurations it re-measures, its verdict on their runs (the
one statistic of measure/noise.py), whether a stored one still describes the study, and its
winner: the best geometric mean, or, within the noise of it, the candidate that changes fewest
knobs from the baseline. (driver/confirm.py does the re-measuring.)
"""

from __future__ import annotations

import math

import optuna

from optimizer.measure.noise import estimate, pooled, rank, ratio
from optimizer.record import of_trial, remeasured
from optimizer.verdict.trials import knobs_of


def candidates(study: optuna.Study, top: int) -> list[optuna.trial.FrozenTrial]:
    """The `top` best feasible COMPLETE trials, one per configuration, best first."""
    if top <= 0 or len(study.directions) > 1:
        return []
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    done = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if all(c <= 0 for c in (t.constraints or {}).values())]
    done.sort(key=lambda t: -t.value if maximize else t.value)
    out, seen = [], set()
    for t in done:
        key = tuple(of_trial.vllm_args(t) or sorted(t.params.items()))
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out[:top]


def read(study: optuna.Study) -> remeasured.Confirmation:
    """The stored confirmation as one snapshot: its verdict read again with this statistic when it
    was stored by a version that used another (no `noise` key: a per-configuration linear interval),
    and whether it still describes the study's top configurations (`current`: new trials may have
    changed them since). Nothing is written: the next `run` stores it again, without a boot (every
    configuration has its runs)."""
    record = remeasured.confirmation_as_stored(study)
    if record.get("runs") and "candidates" in record and "noise" not in record and "winner" in record:
        maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
        runs = {n: e for n, e in record["runs"].items() if "values" in e}
        names = [n for n in record["candidates"] if n in runs]
        record.update(decide(runs, names, noise_of(study, runs), maximize, changed_knobs(study, names)))
    current = record.get("candidates") == [str(t.number) for t in candidates(study, record.get("top", 0))]
    return remeasured.Confirmation.of(record, current)


def settled(study: optuna.Study, top: int, repeats: int) -> bool:
    """Confirmation is done for the study's current top configurations (new trials may have
    changed them since, or the settings may differ), and stored with this statistic."""
    record = remeasured.read_confirmation(study)
    return (record.judged and record.repeats == repeats and record.top == top
            and record.candidates == tuple(t.number for t in candidates(study, top)))


def current_winner(study: optuna.Study) -> int | None:
    """The confirmed winner, if the confirmation still describes the study's top configurations."""
    return read(study).current_winner


def baseline_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """The study's baseline trial once it finished without an infrastructure failure (COMPLETE or PRUNED)."""
    for t in study.get_trials(deepcopy=False):
        if of_trial.is_baseline(t) and t.state.is_finished() and t.state != optuna.trial.TrialState.FAIL:
            return t
    return None


def noise_of(study: optuna.Study, runs: dict | None = None):
    """The noise of one run, pooled over every configuration measured more than once: the
    confirmation's runs (or `runs`, as stored, while it is being made) and the minimal-change step's."""
    if runs is None:
        return pooled_noise(remeasured.read_confirmation(study), remeasured.read_minimal(study))
    return pooled([list(e.get("values") or []) for e in runs.values()] + _minimal_groups(remeasured.read_minimal(study)))


def pooled_noise(conf: remeasured.Confirmation, minimal: remeasured.MinimalChange):
    """noise_of, on records already read."""
    return pooled(conf.every_values() + _minimal_groups(minimal))


def _minimal_groups(minimal: remeasured.MinimalChange) -> list[list[float]]:
    return [[v for v in values if v is not None] for values in minimal.runs.values()]


def changed_knobs(study: optuna.Study, names: list[str]) -> dict[str, int]:
    """Per candidate (trial number as text), how many knobs its configuration changes from the
    baseline's ({} while the study has no baseline trial to count from)."""
    base = baseline_trial(study)
    if base is None:
        return {}
    before = knobs_of(base)
    out = {}
    for n in names:
        after = knobs_of(study.trials[int(n)])
        out[n] = sum(after.get(k) != before.get(k) for k in set(before) | set(after))
    return out


def decide(runs: dict, names: list[str], noise, maximize: bool, changed: dict[str, int] | None = None) -> dict:
    """The confirmation's verdict on its `runs` (trial -> {"values", "failed"}): each candidate's
    geometric mean with its 95% range, the winner, each other's ratio to it, and whether it is clear
    (measure/noise.py: every other measurably worse). The winner is the best mean among those with no
    failed run, unless another within the noise of it changes fewer knobs from the baseline
    (`changed`): then the simpler one wins, the best among the simplest, and `simpler` says over which
    (docs/search.md#re-measurement)."""
    ok = {n: runs[n]["values"] for n in names if not runs[n]["failed"]}
    ranking = rank(ok, noise, maximize)
    winner, ratios, simpler = ranking.winner, ranking.ratios, None
    if changed and noise is not None and winner is not None and not ranking.clear:
        close = [winner] + [n for n, r in ranking.ratios.items() if r.includes_one()]  # best mean first
        fewest = min(close, key=lambda n: changed.get(n, math.inf))
        if changed.get(fewest, math.inf) < changed.get(winner, math.inf):
            simpler = {"over": int(winner), "knobs": changed[fewest], "over_knobs": changed[winner],
                       "ratio": ratio(ok[fewest], ok[winner], noise).as_dict()}
            winner = fewest
            ratios = {n: ratio(ok[n], ok[winner], noise) for n in ok if n != winner}
    return {"intervals": {n: estimate(int(n), v, noise).as_dict() for n, v in ok.items()},
            "ratios": {n: r.as_dict() for n, r in ratios.items()},
            "noise": noise.as_dict() if noise else None,
            "disqualified": [int(n) for n in names if runs[n]["failed"]],
            "winner": int(winner) if winner is not None else None,
            "clear": ranking.clear, "alone": ranking.alone, "simpler": simpler}
