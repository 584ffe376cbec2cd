"""The plan: everything checked before the study is touched (model, device, search space,
workload, objective, storage URL), and the study it opens, stamped with what it measures.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

import optuna

from objectives import get_objective
from optimizer.config import flags
from optimizer.config.daemon_spec import LiveWatch
from optimizer.config import space as space_mod
from optimizer.config import topology
from optimizer.config.model_info import ModelInfo, load_model_info
from optimizer.config.paths import directory_expected
from optimizer.config.schema import StudyConfig
from optimizer.driver import resources as slots_mod
from optimizer.driver.ray_runtime import check_address, job_working_dir
from optimizer.driver.store.database import check_storage, check_stored, normalize_url, open_storage
from optimizer.engine.compile_cache import cache_dir, default_root
from optimizer.engine.device import Device, detect, gpu_name
from optimizer.engine import speculative_config as speculation
from optimizer.engine.real_model import write_real_model
from optimizer.engine.tiny_model import write_tiny_model
from optimizer.engine.vllm_version import installed_vllm
from optimizer.errors import ConfigError, OptimizerError
from optimizer.measure.slo import describe as describe_slos
from optimizer.measure.slo import parse_slos
from optimizer.outputs import gate as outputcheck
from optimizer.record import of_study, version
from optimizer.search.sampler import sampler
from optimizer.trial.rate_search import nominal_rate
from optimizer.workload import Vocabulary, Workload, build_workload
from optimizer.workload.materialize import write_workload


@dataclass(frozen=True)
class Plan:
    cfg: StudyConfig
    model: ModelInfo
    device: Device
    space: space_mod.SearchSpace
    workload: Workload
    objective: object
    storage_url: str
    artifacts: Path
    new_study: bool = False  # a stamp mismatch opens a separate study instead of refusing
    server_env: tuple = ()  # the run-state's tags every trial server carries (driver/store/driver_lock.py)

    def fixed_args(self) -> list[str]:
        """vLLM flags every trial gets: load format, dtype, the user's extra flags."""
        args = []
        if self.cfg.model.load_format:
            args += ["--load-format", self.cfg.model.load_format]
        if self.cfg.model.dtype != "auto":
            args += ["--dtype", self.cfg.model.dtype]
        return args + list(self.cfg.engine.extra_args)

    def server_args(self, params: dict) -> list[str]:
        """Every vLLM flag a trial of `params` starts with: its knobs, what they need, the fixed ones."""
        return flags.to_cli_args(params) + flags.engine_args_for(params, self.device.kind) + self.fixed_args()

    @property
    def compile_cache(self) -> Path:
        """The compile cache every boot of this model under this vLLM release shares."""
        return cache_dir(default_root(), self.model.source, installed_vllm())


MAX_SPAN_S = 24 * 3600.0  # a schedule longer than a day is a mistake (a rate of 1e-4 req/s), not a trial


def prepare(cfg: StudyConfig, new_study: bool = False) -> Plan:
    """Validate the config against the model, device and workload; raises ConfigError. Writes nothing
    except the tiny model directory when the config asks for it."""
    try:
        objective = get_objective(cfg.objective.name, cfg.objective.metric, parse_slos(cfg.objective.slos),
                                  cfg.objective.fleet)
    except ValueError as exc:
        raise ConfigError(f"objective: {exc}") from exc
    device = detect(cfg.engine.device)
    if cfg.engine.device == "gpu" and device.kind != "gpu":
        raise ConfigError("engine.device: 'gpu' asked for but nvidia-smi sees no GPU; use 'auto' or 'cpu'")
    url = normalize_url(cfg.storage, in_job=job_working_dir())
    check_storage(url)  # refused before anything runs
    check_address(cfg.ray.address or os.environ.get("RAY_ADDRESS"))
    directory_expected(cfg.artifacts_dir, "artifacts_dir", "pass --artifacts-dir with a directory (created if missing)")
    directory_expected(Path(cfg.artifacts_dir) / cfg.study_name, "the study's artifacts directory",
                       "move that file away, or pass another --artifacts-dir or --study-name")
    model, workload = load_workload(cfg)  # writes the tiny model when the config asks: the last check
    if workload.longest_request() > model.max_positions:
        raise ConfigError(f"workload: longest request ({workload.longest_request()} tokens) exceeds the model's "
                          f"max_position_embeddings ({model.max_positions}); shorten the workload's longest prompt or output")
    fixed_len = flags.pinned_model_len(cfg.engine.extra_args)
    # (a daemon watching live servers checks its config on a stand-in workload before any window:
    # its observed workloads are cut to the pinned length, observing.observed_spec)
    stand_in = isinstance(cfg.daemon.watch, LiveWatch) and cfg.workload.scenario != "observed"
    if fixed_len is not None and fixed_len < workload.longest_request() and not stand_in:
        raise ConfigError(f"engine.extra_args: --max-model-len {fixed_len} is below the workload's longest request "
                          f"({workload.longest_request()} tokens): every trial server would cut its output short or "
                          "refuse it; raise it, or shorten the workload")
    span = max((r.offset_s for r in workload.requests), default=0.0)
    if span > MAX_SPAN_S:
        raise ConfigError(f"workload: its {len(workload.requests)} requests are sent over {span / 3600:,.1f} h, and every "
                          f"trial replays them; at most {MAX_SPAN_S / 3600:.0f} h: raise the arrival rate, send fewer "
                          "requests, or speed a trace up (arrival.time_scale, max_requests)")
    if objective.mode == "goodput" and nominal_rate(workload.requests) is None:
        raise ConfigError(f"objective goodput: the workload '{workload.name}' has no open-loop schedule to scale "
                          "(a closed loop fixes the concurrency, not the rate); give it an arrival process such as "
                          "{process: poisson, rate: 8}, or use --goal agent")
    if cfg.search.prior == "twin" and (getattr(objective, "multi", False) or objective.mode != "replay"):
        raise ConfigError(f"search.prior: twin predicts one replayed value, and the objective {objective.name} "
                          f"{'has several' if getattr(objective, 'multi', False) else 'runs a rate search'}; "
                          "use search.prior: none, or a throughput or latency objective")
    space = space_mod.resolve(cfg, device, model, workload.longest_request(), trials_at_once(cfg))
    if speculation.check_args(cfg.engine.extra_args, "engine.extra_args", model.vocab_size) is not None \
            and speculation.KNOB in cfg.space:
        raise ConfigError(f"engine.extra_args: {speculation.FLAG} is also searched (space.{speculation.KNOB}); "
                          "remove it from extra_args, or from space to hold it fixed")
    outputcheck.trial_spec_part(cfg)  # a missing or empty prompts file is refused here
    artifacts = Path(cfg.artifacts_dir).expanduser().resolve() / cfg.study_name
    plan = Plan(cfg, model, device, space, workload, objective, url, artifacts, new_study)
    if _embedded_ray(cfg):  # its one node is this machine
        slots_mod.check_sizes(plan, [_this_machine(device)], "the embedded local Ray")
        slots_mod.check_memory_together(plan, [_this_machine(device)])
    _check_budget(plan)
    return plan


def trials_at_once(cfg: StudyConfig) -> int:
    """Trials side by side on this machine: the embedded Ray's `ray.parallel`, at most as many as
    its cores hold at `ray.trial_cpus` each (on a cluster each node is another machine: 1)."""
    if not _embedded_ray(cfg):
        return 1
    return max(1, min(cfg.ray.parallel or 1, (os.cpu_count() or 1) // (cfg.ray.trial_cpus or 1)))


def _embedded_ray(cfg: StudyConfig) -> bool:
    """No cluster named (config or RAY_ADDRESS): the trials run on this machine's embedded Ray."""
    return not (cfg.ray.address or os.environ.get("RAY_ADDRESS"))


def _check_budget(plan: Plan) -> None:
    """A fleet budget smaller than the smallest replica the space can run leaves nothing feasible."""
    budget = getattr(plan.objective, "budget", None)
    base = baseline_params(plan)
    smallest = {d.knob.name: min(int(c) for c in d.choices) for d in plan.space.dims if d.knob.name in topology.PARALLEL}
    devices = topology.ranks({**base, **smallest})
    if budget is not None and budget < devices:
        raise ConfigError(f"objective.fleet.budget: {budget} device(s) is less than the smallest replica the space "
                          f"can run ({topology.label({**base, **smallest})}: {devices} devices); raise the budget "
                          "or allow smaller parallel sizes")


def _this_machine(device: Device) -> dict:
    """The one node of the embedded Ray (driver/ray_runtime.py: all cores, the GPUs Ray detects)."""
    return {"Alive": True, "Resources": {"CPU": float(os.cpu_count() or 1), "GPU": float(device.count)}}


def load_workload(cfg: StudyConfig) -> tuple[ModelInfo, Workload]:
    """The model (a demo one written first if the config asks) and the workload built for it."""
    if cfg.model.tiny:
        write_tiny_model(cfg.model.path)
    elif cfg.model.smollm2:
        write_real_model(cfg.model.path)
    model = load_model_info(cfg.model.path, cfg.model.dtype)
    return model, build_workload(cfg.workload, Vocabulary(model.vocab_size, model.source, model.max_positions))


def open_study(plan: Plan) -> tuple[optuna.Study, Plan]:
    """Open (or create) the study; with `new_study`, a study stamped with another workload,
    objective or model is left as it is and a separate one, named after the new stamp, is opened."""
    check_stored(plan.storage_url, plan.cfg.study_name)  # refused before a byte is written
    storage = open_storage(plan.storage_url)
    # Optuna 5 keeps a stored study's direction silently; the stamp check catches an objective change.
    study = optuna.create_study(study_name=plan.cfg.study_name, storage=storage,
                                directions=list(plan.objective.directions), load_if_exists=True)
    mismatch = stamp_mismatch(study, plan)
    if mismatch and plan.new_study:
        name = f"{plan.cfg.study_name}-{_stamp_digest(plan)[:8]}"
        cfg = plan.cfg.model_copy(update={"study_name": name})
        plan = replace(plan, cfg=cfg, artifacts=plan.artifacts.parent / name, new_study=False)
        return open_study(plan)
    if mismatch:
        key, old = mismatch
        raise ConfigError(f"study '{study.study_name}' was run with another {key.replace('_', ' ')} ({old}); "
                          "pass --new-study to start a separate study (the old one is kept), or --study-name NEW")
    study.sampler = sampler(plan.cfg.seed, len(study.trials), plan.objective.multi)  # search/sampler.py
    if not of_study.stamped(study):
        _stamp(study, plan)
    version.migrate(study)
    if of_study.fp8_kv(study) != plan.device.fp8_kv:  # the driver's CPU now: a study may move
        of_study.write_fp8_kv(study, plan.device.fp8_kv)  # whether remedies may suggest an fp8 KV cache
    return study, plan


def objective_stamp(objective) -> str:
    """How a study records what it optimizes, e.g. 'latency:ttft_p95 slos p95 TPOT <= 50 ms'."""
    text = f"{objective.name}:{objective.metric}" + getattr(objective, "terms", "")
    return text + (f" slos {describe_slos(objective.slos)}" if objective.slos else "")


def _stamp_of(plan: Plan) -> dict:
    return of_study.identity(objective_stamp(plan.objective), plan.workload.content_hash(), plan.model.source)


def _stamp_digest(plan: Plan) -> str:
    return hashlib.sha256(json.dumps(_stamp_of(plan), sort_keys=True).encode()).hexdigest()


def stamp_mismatch(study: optuna.Study, plan: Plan) -> tuple[str, str] | None:
    """A resumed study must measure the same thing: the first stamp key that differs, with its old value."""
    if not of_study.stamped(study):
        return None
    old = of_study.identity_of(study)
    for key, value in _stamp_of(plan).items():
        if old[key] != value:
            return key, old[key]
    return None


def _stamp(study: optuna.Study, plan: Plan) -> None:
    """A new study records what it measures, and the file its workload was materialized to.
    `workload_hash` goes last: a study is stamped only once all of it is there."""
    try:
        of_study.write_workload_file(study, str(write_workload(plan.workload, plan.artifacts)))
    except OptimizerError as exc:  # a full disk: the study still runs (trials get the workload through Ray)
        of_study.write_workload_file_error(study, str(exc))
    of_study.write_workload(study, plan.workload.description, list(plan.workload.notes))
    # the vLLM version: the deployment manifests' image (fleet/manifests.py); which GPU: what-if
    # calibrates on it (whatif/study_calibration.py)
    of_study.write_device(study, plan.device.kind, installed_vllm() or "",
                          gpu_name() if plan.device.kind == "gpu" else "")
    version.stamp(study)
    of_study.write_identity(study, _stamp_of(plan))


def baseline_params(plan: Plan) -> dict:
    return dict(plan.cfg.baseline or {})
