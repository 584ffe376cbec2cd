"""The end of a run: a table of trials, the recommended configuration (verdict/recommendation.py)
as a deployable `vllm serve` command, `vllm serve --config` YAML and Kubernetes manifests of one
replica (`k8s.yaml`, fleet/manifests.py; `plan --manifests` sizes them), and its gain over the baseline.

With SLO constraints only trials that met them are candidates (Optuna's own rule); a
multi-objective (Pareto) study has no single best: its front is listed, each member
with its command, and written to `pareto_front.yaml`. The run's savings are counted:
boots the KV precheck avoided, replay time early stopping saved.
"""

from __future__ import annotations

import shlex

from dataclasses import dataclass, field
from pathlib import Path

import optuna
import yaml

from optimizer.atomic_file import write_atomic
from optimizer.config.flags import from_cli_args, random_weights, split_flags
from optimizer.config.space import KNOBS
from optimizer.fleet.manifests import manifests, to_yaml
from optimizer.record import of_study, of_trial
from optimizer.verdict import confirmed
from optimizer.verdict.recommendation import Recommendation, recommend
from optimizer.verdict.trials import COMPLETE, feasible, knobs_of, savings  # noqa: F401 - rep.feasible etc. for the report



@dataclass(frozen=True)
class Summary:
    best: optuna.trial.FrozenTrial | None
    baseline: optuna.trial.FrozenTrial | None
    gain: float | None  # > 1 means better than the baseline, whatever the direction
    command: str | None
    yaml_path: Path | None
    front: tuple[optuna.trial.FrozenTrial, ...] = ()  # multi-objective studies
    infeasible_only: bool = False  # trials completed, none met the SLO constraints
    savings: dict = field(default_factory=dict)
    confirmation: dict = field(default_factory=dict)  # re-measurements of the top configurations (driver/confirm.py)
    recommendation: Recommendation | None = None  # what `command` and best.yaml deploy (verdict/recommendation.py)


RANDOM_WEIGHTS_NOTE = ("# Measured with random weights (--load-format dummy): for speed only. Remove load-format\n"
                       "# before serving, or vLLM will answer with noise.\n")


def serve_command(model: str, args: list[str]) -> str:
    """The `vllm serve` command for a trial's flags."""
    return shlex.join(["vllm", "serve", model, *args])  # pasted into a shell: a --speculative-config's JSON quoted


def serve_yaml(args: list[str]) -> dict:
    """`vllm serve --config` takes long-form flag names as keys."""
    out = {}
    for key, value in split_flags(args):
        out[key] = from_cli_args([f"--{key}", value])[key] if key in KNOBS and value is not True else value
    return out


def savings_text(sv: dict) -> str:
    """The savings in one sentence (the console's and the written report's)."""
    repeats = f"{sv['repeats']} repeat(s) of a measured configuration told without a boot; " if sv.get("repeats") else ""
    too_big = f"{sv['too_big']} by a topology no node holds; " if sv.get("too_big") else ""
    return (f"Saved: {sv['boots_avoided']} boot(s) avoided by the KV precheck; {too_big}{repeats}{sv['early_stopped']} "
            f"trial(s) stopped early; ~{sv['replay_saved_s']:.0f} s of replay not spent")


def summarize_study(study: optuna.Study, model: str, artifacts: Path) -> Summary:
    complete = study.get_trials(deepcopy=False, states=(COMPLETE,))
    base = confirmed.baseline_trial(study)
    saved = savings(study)
    if not complete:
        return Summary(None, base, None, None, None, savings=saved)
    if len(study.directions) > 1:
        front = tuple(t for t in study.best_trials if feasible(t))
        if not front:
            return Summary(None, base, None, None, None, infeasible_only=True, savings=saved)
        path = _write(artifacts / "pareto_front.yaml",
                      [{"trial": t.number, "values": list(t.values),
                        "config": serve_yaml(of_trial.vllm_args(t))} for t in front])
        return Summary(None, base, None, None, path, front, savings=saved)
    rec = recommend(study)
    if rec is None:
        return Summary(None, base, None, None, None, infeasible_only=True, savings=saved)
    winner = confirmed.current_winner(study)
    record = confirmed.stored(study) if winner is not None else {}  # a stale one says nothing
    args = list(rec.args)
    path = _write(artifacts / "best.yaml", serve_yaml(args), RANDOM_WEIGHTS_NOTE if random_weights(args) else "")
    write_manifests(artifacts / "k8s.yaml", study, model, args, rec.trial, replicas=1)
    g = rec.gain["ratio"] if rec.gain else None
    return Summary(rec.trial, base, g, serve_command(model, args), path, savings=saved, confirmation=record,
                   recommendation=rec)


def write_manifests(path: Path, study: optuna.Study, model: str, args: list[str], trial: optuna.trial.FrozenTrial,
                    replicas: int) -> Path | None:
    """The Deployment and Service of `replicas` pods of this configuration (`args`, from `trial`), on
    the study's device, at the vLLM version the study recorded (else the one installed here)."""
    from optimizer.engine.vllm_version import installed_vllm  # noqa: PLC0415
    from optimizer.report.capacity import parallel_sizes  # noqa: PLC0415

    gpus = parallel_sizes(args, trial.params)[1]
    version = of_study.vllm_version(study) or installed_vllm() or "0.32.0"
    docs = manifests(study.study_name, model, args, replicas, of_study.device(study) or "gpu", gpus,
                     cores(of_trial.cpu_bind(trial)), vllm_version=version,
                     memory_bytes=claimed_bytes(trial, parallel_sizes(args, trial.params)[1]))
    try:
        write_atomic(path, to_yaml(docs))
    except OSError:
        return None
    return path


def claimed_bytes(trial: optuna.trial.FrozenTrial, ranks: int) -> int | None:
    """What a trial's server claimed, from its KV estimate: the KV budget and the rest, per rank."""
    est = of_trial.kv_estimate(trial)
    per_rank = int(est.get("budget_bytes") or 0) + int(est.get("non_kv_bytes") or 0)
    return per_rank * max(1, ranks) if per_rank > 0 else None


def cores(bind: str) -> int:
    """How many cores a VLLM_CPU_OMP_THREADS_BIND value names ("0-3", "0,2", "0|1"); 1 when none."""
    from optimizer.engine.cpu_cores import parse_cpu_list  # noqa: PLC0415

    return max(1, len(parse_cpu_list(bind)))


def _write(path: Path, data, header: str = "") -> Path | None:
    """Write a YAML artifact whole (atomic_file.py), `header` (comment lines) first; None when the
    disk refuses it (the report says so, the study is fine)."""
    try:
        write_atomic(path, header + yaml.safe_dump(data, sort_keys=False))
    except OSError:
        return None
    return path


def fmt_params(params: dict) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()) or "(vLLM defaults)"


