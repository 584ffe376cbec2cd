"""A study a run already stored, opened for the commands that read it (`report`, `plan`,
`sensitivity`): never created, never altered by opening it (read-only: the file keeps its
journal mode, and no connection stays open between reads, so no `-wal`/`-shm` is left)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import optuna

from objectives import get_objective
from optimizer.driver.plan import objective_stamp
from optimizer.driver.ray_runtime import job_working_dir
from optimizer.driver.store.database import (
    check_storage,
    masked,
    normalize_url,
    open_storage,
    sqlite_path,
)
from optimizer.errors import ConfigError
from optimizer.measure.slo import parse_slos
from optimizer.record import of_study, version


@dataclass(frozen=True)
class Finished:
    study: optuna.Study
    model: str  # as the study's trials served it (the study's stamp), for the `vllm serve` command
    artifacts: Path  # artifacts/<study>
    objective: object
    url: str


def open_finished(cfg, check_objective: bool = True) -> Finished:
    """The config's study in its storage; raises ConfigError (a one-line fix) when there is none, or
    (`check_objective`) when the study was run with another objective than the config's: its
    values would be labelled and judged as something they are not."""
    url = normalize_url(cfg.storage, in_job=job_working_dir())
    path = sqlite_path(url)
    if path is not None and (not path.exists() or (path.is_file() and path.stat().st_size == 0)):
        # an empty file is no database either (opening it would write Optuna's tables into it)
        raise ConfigError(f"no study database at {path}: run `python -m optimizer run` first, or pass --storage")
    check_storage(url)
    storage = open_storage(url, read_only=True)
    try:
        study = optuna.load_study(study_name=cfg.study_name, storage=storage)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
        raise ConfigError(f"no study '{cfg.study_name}' in {masked(url)} (it holds: {', '.join(names) or 'none'}); "
                          "pass --study-name, or run `python -m optimizer run` first") from None
    version.check(study)
    try:
        objective = get_objective(cfg.objective.name, cfg.objective.metric, parse_slos(cfg.objective.slos),
                                  cfg.objective.fleet)
    except ValueError as exc:
        raise ConfigError(f"objective: {exc}") from exc
    stored = of_study.objective(study)
    if check_objective and stored and stored != objective_stamp(objective):
        raise ConfigError(f"study '{cfg.study_name}' was run with objective {stored}, the config says "
                          f"{objective_stamp(objective)}; pass the config (or --goal / --objective / --slo) it ran with")
    model = of_study.model(study) or cfg.model.path
    artifacts = Path(cfg.artifacts_dir).expanduser().resolve() / cfg.study_name
    return Finished(study, model, artifacts, objective, url)
