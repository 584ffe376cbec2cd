"""What a trial records: the role it was queued with, the flags it ran, what it measured, how it
failed. The driver writes them before it tells Optuna the outcome (they cannot be set after).

A trial is queued as the baseline, a configured warm start (`enqueued`), a screening move
(`screen`: the knob it moved) or a retry (`retry_of`); a sampler's draw carries no role. A trial
told without a boot because it runs exactly the flags of a finished one is a repeat (`repeat_of`)
and carries over what that one measured and how it was judged, not how it booted.
"""

from __future__ import annotations

from optimizer.record._holder import attrs, get, has, put, put_stored

BASELINE, ENQUEUED, WARM_START, SCREEN = "baseline", "enqueued", "warm_start", "screen"
RETRY_OF, RETRY_REASON = "retry_of", "retry_reason"
REPEAT_OF, BUDGET = "repeat_of", "budget"  # budget: the n_trials in force when a repeat was told
VLLM_ARGS, CPU_BIND, KV_ESTIMATE, PRECHECK = "vllm_args", "cpu_bind", "kv_estimate", "precheck"
PRECHECK_PRUNED, PRECHECK_TOO_BIG = "pruned", "too_big"  # the KV precheck ruled it out; its ranks fit no node
PHASES, STARTUP, REPLAY_CPU, METRICS, SERVER = "phases_s", "startup", "replay_cpu", "metrics", "server"
HOST, OMP_THREADS, STOP, RATE_SEARCH = "host", "omp_threads", "stop", "rate_search"
EARLY_STOP, DRIVER_CHANNEL, SERVER_PROCESS = "early_stop", "driver_channel", "server_process"
FAILURE_KIND, EVIDENCE, REMEDY, FITS_MAX_MODEL_LEN = "failure_kind", "evidence", "remedy", "fits_max_model_len"
VALUE_FROM_PARTIAL_RUN, SLO_EXCESS, FEASIBLE = "value_from_partial_run", "slo_excess", "feasible"
FLEET_DEVICES, REGRESSION = "fleet_devices", "regression"
PRIOR = "prior"  # what the twin predicted before the trial booted (search/prior.py)
# What a repeat carries over from the trial it repeats: what was measured and judged, not how
# the boot went (phases, start-up, host): a repeat never booted.
REPEAT_COPIED = (METRICS, SERVER, SLO_EXCESS, FEASIBLE, VALUE_FROM_PARTIAL_RUN, EARLY_STOP,
                 FAILURE_KIND, EVIDENCE, REMEDY, FITS_MAX_MODEL_LEN)


def all_attrs(t) -> dict:
    """Every stored attribute, as a plain mapping these accessors read."""
    return dict(attrs(t))


# ---- roles ---------------------------------------------------------------------------------------
def is_baseline(t) -> bool:
    return bool(get(t, BASELINE))


def screen(t) -> str | None:
    """The knob a screening trial moved alone from the baseline (None: not a screening trial)."""
    return get(t, SCREEN)


def is_screen(t) -> bool:
    return has(t, SCREEN)


def queued(t) -> bool:
    """Queued by the tool (the baseline, a warm start, a screening move, a retry), not a sampler's draw."""
    return any(has(t, key) for key in (BASELINE, ENQUEUED, RETRY_OF, SCREEN))


def roles(t) -> dict:
    """The roles a retry keeps (baseline, warm start, screening move)."""
    return {key: get(t, key) for key in (BASELINE, ENQUEUED, WARM_START, SCREEN) if has(t, key)}


def retry_of(t) -> int | None:
    return get(t, RETRY_OF)


def retry_reason(t) -> str | None:
    return get(t, RETRY_REASON)


def repeat_of(t) -> int | None:
    """The trial whose outcome this one was told (it ran exactly its flags); None: not a repeat."""
    return get(t, REPEAT_OF)


def is_repeat(t) -> bool:
    return has(t, REPEAT_OF)


def budget(t) -> int:
    return get(t, BUDGET, 0)


def enqueue_baseline(study, params: dict) -> None:
    study.enqueue_trial(params, user_attrs={BASELINE: True})


def enqueue_configured(study, params: dict) -> None:
    """A warm start from the config's `enqueue` (once: skipped where already queued)."""
    study.enqueue_trial(params, user_attrs={ENQUEUED: True}, skip_if_exists=True)


def enqueue_screen(study, params: dict, knob: str) -> None:
    study.enqueue_trial(params, user_attrs={SCREEN: knob})


def enqueue_again(study, params: dict, kept_roles: dict, of: int, reason: str = "") -> None:
    """A retry of trial `of`, with the roles it had (`roles`) and why it runs again."""
    study.enqueue_trial(params, user_attrs={**kept_roles, RETRY_OF: of, **({RETRY_REASON: reason} if reason else {})})


def mark_repeat(trial, source, budget_now: int) -> None:
    """`trial` repeats `source` (told under the budget `budget_now`): what `source` measured is carried over."""
    put(trial, REPEAT_OF, source.number)
    put(trial, BUDGET, budget_now)
    for key in REPEAT_COPIED:
        if has(source, key):
            put(trial, key, get(source, key))


# ---- how it ran ----------------------------------------------------------------------------------
def vllm_args(t) -> list:
    """The vLLM flags it ran ([] before its launch)."""
    return list(get(t, VLLM_ARGS) or [])


def cpu_bind(t) -> str:
    return str(get(t, CPU_BIND) or "")


def kv_estimate(t) -> dict:
    return get(t, KV_ESTIMATE) or {}


def prior(t) -> dict:
    return get(t, PRIOR) or {}


def write_prior(trial, predicted: dict) -> None:
    put(trial, PRIOR, predicted)


def pruned_by_precheck(t) -> bool:
    return get(t, PRECHECK) == PRECHECK_PRUNED


def too_big(t) -> bool:
    return get(t, PRECHECK) == PRECHECK_TOO_BIG


def write_vllm_args(trial, args) -> None:
    put(trial, VLLM_ARGS, list(args))


def write_cpu_bind(trial, cores: str) -> None:
    put(trial, CPU_BIND, cores)


def write_kv_estimate(trial, estimate: dict) -> None:
    put(trial, KV_ESTIMATE, estimate)


def mark_precheck(trial, too_big_for_nodes: bool) -> None:
    """Pruned before its boot: its ranks fit no node, or (else) the KV precheck ruled it out."""
    put(trial, PRECHECK, PRECHECK_TOO_BIG if too_big_for_nodes else PRECHECK_PRUNED)


def write_server_process(trial, where: dict) -> None:
    put(trial, SERVER_PROCESS, where)


# ---- what it measured ----------------------------------------------------------------------------
def phases(t) -> dict:
    return get(t, PHASES) or {}


def startup(t) -> dict:
    return get(t, STARTUP) or {}


def metrics(t) -> dict:
    return get(t, METRICS) or {}


def server(t) -> dict:
    """The server's own /metrics over the replay (speculation, prefix cache, queue)."""
    return get(t, SERVER) or {}


def rate_search(t) -> list:
    return get(t, RATE_SEARCH) or []


def early_stop(t) -> dict:
    """How it was stopped early ({} when it was not)."""
    return get(t, EARLY_STOP) or {}


def write_measured(trial, *, phases: dict, metrics: dict, host: str, omp_threads, startup: dict | None = None,  # noqa: PLR0913
                   replay_cpu: dict | None = None, server: dict | None = None, stop: dict | None = None,
                   rate_search: list | None = None, early_stop: dict | None = None, channel: dict | None = None) -> None:
    """What a trial's task returned, in the order it is stored; the optional parts only where given."""
    put(trial, PHASES, phases)
    for key, value in ((STARTUP, startup), (REPLAY_CPU, replay_cpu)):
        if value is not None:
            put(trial, key, value)
    put(trial, METRICS, metrics)
    if server is not None:
        put(trial, SERVER, server)
    put(trial, HOST, host)
    put(trial, OMP_THREADS, omp_threads)
    for key, value in ((STOP, stop), (RATE_SEARCH, rate_search), (EARLY_STOP, early_stop), (DRIVER_CHANNEL, channel)):
        if value is not None:
            put(trial, key, value)


# ---- how it was judged ---------------------------------------------------------------------------
def failure_kind(t) -> str:
    return get(t, FAILURE_KIND) or ""


def evidence(t) -> str:
    return get(t, EVIDENCE) or ""


def remedy(t) -> str:
    return get(t, REMEDY) or ""


def slo_excess(t) -> dict:
    """Each SLO's excess over its limit (<= 0 held)."""
    return get(t, SLO_EXCESS) or {}


def marked_feasible(t) -> bool | None:
    """Whether it held its SLOs, as told (None: no SLOs judged it)."""
    return get(t, FEASIBLE)


def value_from_partial_run(t) -> bool:
    return bool(get(t, VALUE_FROM_PARTIAL_RUN))


def regression(t) -> dict:
    """The output gate's record: its summary, the flip rate, the reference trial ({}: not checked)."""
    return get(t, REGRESSION) or {}


def _failure(kind: str, evidence: str, remedy: str, fits: int | None) -> list[tuple[str, object]]:
    return [(FAILURE_KIND, kind), (EVIDENCE, evidence), (REMEDY, remedy)] + ([(FITS_MAX_MODEL_LEN, fits)] if fits else [])


def write_failure(trial, kind: str, evidence: str, remedy: str, fits_max_model_len: int | None = None) -> None:
    for key, value in _failure(kind, evidence, remedy, fits_max_model_len):
        put(trial, key, value)


def write_failure_stored(study, frozen, kind: str, evidence: str, remedy: str) -> None:
    """The failure of a trial known only as stored (one a dead driver left RUNNING)."""
    for key, value in _failure(kind, evidence, remedy, None):
        put_stored(study, frozen, key, value)


def mark_value_from_partial_run(trial) -> None:
    put(trial, VALUE_FROM_PARTIAL_RUN, True)


def write_slo_excess(trial, excess: dict, held: bool) -> None:
    put(trial, SLO_EXCESS, excess)
    put(trial, FEASIBLE, held)


def write_fleet_devices(trial, devices) -> None:
    put(trial, FLEET_DEVICES, devices)


def write_regression(trial, record: dict) -> None:
    put(trial, REGRESSION, record)
