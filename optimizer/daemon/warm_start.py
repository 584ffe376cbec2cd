"""The next generation's warm starts: the previous generation's best configurations, and those
the new generation's space still accepts (its ranges follow the new traffic)."""

from __future__ import annotations

from optimizer.config import space as space_mod
from optimizer.config.flags import from_cli_args
from optimizer.driver.plan import Plan, trials_at_once
from optimizer.errors import ConfigError
from optimizer.record import of_study
from optimizer.verdict.recommendation import recommend
from optimizer.verdict.trials import knobs_of, ranked_feasible


def warm_starts(study, k: int) -> list[dict]:
    """The previous generation's best configurations, best first: its recommendation
    (verdict/recommendation.py: the minimal change, else the confirmed winner), then the best
    feasible COMPLETE trials; the values they ran with, distinct parameter sets only."""
    if k <= 0 or len(study.directions) > 1:
        return []
    done = ranked_feasible(study)
    rec = recommend(study)
    out: list[dict] = []
    # The knobs the space asks for: a trial's own draws, and the ones screening held at the
    # baseline's value (not drawn, so not in its params, but part of what it ran).
    held = set(of_study.screening(study) or {})
    if rec is not None:
        ran = from_cli_args(list(rec.args)) if rec.changed_from_trial else knobs_of(rec.trial)
        out.append({name: ran[name] for name in set(rec.trial.params) | held if name in ran})
        done.sort(key=lambda t: t.number != rec.trial.number)
    for t in done:
        ran = knobs_of(t)
        params = {name: ran.get(name, value) for name, value in t.params.items()}
        params.update({name: ran[name] for name in held if name in ran and name not in params})
        if params not in out:
            out.append(params)
        if len(out) == k:
            break
    return out[:k]


def fitting(candidates: list[dict], plan: Plan) -> tuple[list[dict], list[str]]:
    """The warm starts the new generation's space accepts (its ranges follow the new traffic:
    a max-model-len below the new longest request is dropped), and why the others were."""
    kept, dropped = [], []
    for params in candidates:
        trial_cfg = plan.cfg.model_copy(update={"enqueue": [params]})
        try:
            space_mod.resolve(trial_cfg, plan.device, plan.model, plan.workload.longest_request(),
                              trials_at_once(plan.cfg))
        except ConfigError as exc:
            dropped.append(str(exc))
            continue
        kept.append(params)
    return kept, dropped
