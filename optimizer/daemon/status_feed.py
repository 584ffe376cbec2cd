"""The daemon's progress, fed to the status API: the console lines of `Progress`, plus the
`StatusState` the API serves (state, trial counts, the running trial and its phase, the best
so far with its `vllm serve` command). Every event also beats the heartbeat `/healthz` reads.
"""

from __future__ import annotations

import time
from collections import Counter

from sqlalchemy.engine import make_url

from optimizer.daemon.status_api import TRIAL_STATES, StatusState
from optimizer.driver.progress import Progress
from optimizer.verdict.recommendation import recommend
from optimizer.text.verdicts import attribution
from optimizer.deploy.serve import serve_command


def masked(url: str) -> str:
    """A storage URL without its password (it is served over HTTP)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - never let a display helper fail the daemon
        return "(unparsable URL)"


def trial_counts(study) -> dict[str, int]:
    seen = Counter(t.state.name for t in study.get_trials(deepcopy=False))
    return {name: seen.get(name, 0) for name in TRIAL_STATES}


def best_of(study, objective, model: str) -> dict | None:
    """The study's recommendation as the status API shows it (verdict/recommendation.py: while trials
    run, the best feasible single run; after the confirmation and the minimal-change step, what they
    chose, with its gain and what mattered). None for Pareto or none yet."""
    if getattr(objective, "multi", False):
        return None
    rec = recommend(study)
    if rec is None:
        return None
    return {"number": rec.trial.number, "value": rec.value, "runs": len(rec.values), "source": rec.source,
            "objective": objective.name, "metric": objective.metric, "unit": objective.unit,
            "direction": objective.direction, "command": serve_command(model, list(rec.args)),
            "gain": rec.gain, "what_mattered": [dict(zip(MATTERED, row)) for row in attribution(rec)]}


MATTERED = ("knob", "baseline", "winner", "effect", "verdict", "rests_on")


class StatusProgress(Progress):
    def __init__(self, console, state: StatusState, generation: int = 1, dashboard=None):
        super().__init__(console, dashboard)
        self.state = state
        self.generation = generation
        self._plan = None
        self._study = None
        self._running: dict[int, dict] = {}  # parallel trials: every one running, oldest first

    def opened(self, plan, study, recovered: int) -> None:
        super().opened(plan, study, recovered)
        self._plan, self._study = plan, study
        self._running.clear()
        self.state.set(state="tuning", study=study.study_name, storage=masked(plan.storage_url),
                       generation=self.generation, n_trials=plan.cfg.n_trials, running=None, running_trials=[],
                       last_error=None,
                       trials=trial_counts(study), best=best_of(study, plan.objective, plan.model.source))

    def trial_started(self, number, position, total, params, baseline, screen=None) -> None:
        super().trial_started(number, position, total, params, baseline, screen)
        counts = trial_counts(self._study) if self._study is not None else None
        self._running[number] = {"number": number, "phase": "queued", "params": dict(params), "since": time.time()}
        self._show_running(**({"trials": counts} if counts else {}))

    def _show_running(self, **more) -> None:
        """`running`: the newest trial (one at a time: the trial); `running_trials`: all of them."""
        trials = list(self._running.values())
        self.state.set(running=trials[-1] if trials else None, running_trials=trials, **more)

    def phase(self, number, phase, elapsed) -> None:
        super().phase(number, phase, elapsed)
        entry = self._running.get(number)
        if entry is not None and entry.get("phase") != phase:
            entry["phase"] = phase
            self._show_running()
        else:
            self.state.beat()

    def trial_done(self, study, number, result, state, objective) -> None:
        super().trial_done(study, number, result, state, objective)
        self._running.pop(number, None)
        self._show_running(trials=trial_counts(study),
                           best=best_of(study, objective, self._plan.model.source if self._plan else ""))

    def repeated(self, study, number, params, source, state) -> None:
        super().repeated(study, number, params, source, state)
        self._running.pop(number, None)
        self._show_running(trials=trial_counts(study))

    def confirming(self, top, repeats) -> None:
        super().confirming(top, repeats)
        self.state.set(state="confirming")

    def minimizing(self, number, back, cap) -> None:
        super().minimizing(number, back, cap)
        self.state.set(state="minimizing")

    def confirm_value(self, number, k, value) -> None:
        super().confirm_value(number, k, value)
        self._running.clear()
        self._show_running()

    def waiting_disk(self, directory, why) -> None:
        super().waiting_disk(directory, why)
        self.state.set(state="waiting_disk", last_error=f"{directory}: {why}")

    def disk_back(self, directory) -> None:
        super().disk_back(directory)
        self.state.set(state="tuning", last_error=None)

    def heartbeat(self) -> None:
        self.state.beat()
