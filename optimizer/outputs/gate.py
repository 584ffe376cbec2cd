"""The output-regression check in use: the prompt set a study asks for, the study's gate (a trial's
greedy outputs against the baseline's), and `python -m optimizer regress`.

In a study (`regression: {enabled: true, max_flip_rate: ...}`) every measured trial answers the
prompt set after its replay (trial/task.py). The baseline's answers become the study's reference
(study user attribute `regression_reference`); every later trial is compared with them
(regression.compare) and the comparison stored on it (`regression`). Above `max_flip_rate` the
trial is PRUNED as `output_changed`: it cannot become the best. A trial measured before the
baseline's answers exist (parallel trials) is compared with nothing and says so.

`regress` boots the baseline and each candidate in turn in this process (no Ray: on a cluster,
submit it as a job on a GPU node, `ray job submit --entrypoint-num-gpus N -- python -m optimizer
regress ...`), answers the prompt set on each, and prints each candidate's comparison.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

from optimizer import shutdown
from optimizer.engine.cpu_cores import bind_free_cores
from optimizer.engine.failures import Failure
from optimizer.engine.vllm import VllmServer
from optimizer.errors import ConfigError
from optimizer.engine import speculative_config as speculation
from optimizer.outputs import compare as regression
from optimizer.outputs import speculation_check
from optimizer.outputs.speculation_check import split
from optimizer.record import of_study, of_trial


def prompt_set(spec) -> tuple[str, ...]:
    """The prompts a study or `regress` uses (config `regression`); raises ConfigError."""
    if spec.prompts_file is None:
        if spec.prompts > len(regression.DEFAULT_PROMPTS):
            raise ConfigError(f"regression.prompts: {spec.prompts} asked for, the built-in set has "
                              f"{len(regression.DEFAULT_PROMPTS)}; lower it or give prompts_file")
        return tuple(regression.DEFAULT_PROMPTS[:spec.prompts])
    path = Path(spec.prompts_file).expanduser()
    try:
        lines = [line.strip() for line in path.read_text().splitlines()]
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"regression.prompts_file {path}: cannot read it ({getattr(exc, 'strerror', None) or exc}); "
                          "give a UTF-8 text file with one prompt per line") from exc
    prompts = tuple(line for line in lines if line)[:spec.prompts]
    if not prompts:
        raise ConfigError(f"regression.prompts_file {path}: no prompt in it; one prompt per line")
    return prompts


def trial_spec_part(cfg) -> tuple | None:
    """What TrialSpec.regression carries for this config: (prompts, max_tokens, top_k, batch), or None.
    `batch` is 1 unless the study searches speculation (then regression.batch: each trial also answers
    that many prompts at a time, outputs/speculation_check.py)."""
    r = cfg.regression
    batch = r.batch if speculation.KNOB in cfg.space else 1
    return (prompt_set(r), r.max_tokens, r.top_k, batch) if r.enabled else None


def speculating(params: dict) -> bool:
    """Whether a trial's knobs turn speculative decoding on."""
    return params.get(speculation.KNOB, speculation.OFF) != speculation.OFF


def gate(study, trial, result, cfg):
    """Before the tell: keep the baseline's answers as the reference, or compare a trial's with
    them (stored on the trial) and fail it `output_changed` above the maximum flip rate."""
    r = cfg.regression
    if not r.enabled or result.failure is not None:
        return result
    if result.outputs_error or not result.outputs:
        of_trial.write_regression(trial, {"summary": f"not checked: {result.outputs_error or 'no outputs'}"})
        return result
    asked = asked_for(cfg)
    if of_trial.is_baseline(trial):
        of_study.write_regression_reference(study, trial.number, result.outputs, asked)
        if r.max_flip_rate is not None:
            of_study.write_max_flip_rate(study, r.max_flip_rate)  # diagnosis.Context reads it
        of_trial.write_regression(trial, {"summary": "the reference: the other trials' outputs are compared with these"})
        return result
    reference = of_study.regression_reference(study)
    if not reference:
        of_trial.write_regression(trial, {"summary": "not compared: the baseline's outputs are not recorded (it "
                                                     "did not finish first, failed, or ran before the check was on)"})
        return result
    if any(reference.get(k, 1 if k == "batch" else None) != v for k, v in asked.items()):  # no batch: alone only
        of_trial.write_regression(trial, {"summary": "not compared: the baseline answered another prompt set, "
                                                     "max_tokens, top_k or batch (the config's regression section "
                                                     "or the searched knobs changed)"})
        return result
    try:
        record, rate, summary = _compared([regression.Output.from_dict(o) for o in reference["outputs"]],
                                          [regression.Output.from_dict(o) for o in result.outputs],
                                          speculating(trial.params))
    except ValueError as exc:  # another prompt set than the reference's (the config changed)
        of_trial.write_regression(trial, {"summary": f"not compared: {exc}"})
        return result
    of_trial.write_regression(trial, {**record, "summary": summary, "reference_trial": reference["trial"],
                                      "max_flip_rate": r.max_flip_rate})
    if r.max_flip_rate is not None and rate > r.max_flip_rate:
        return replace(result, failure=Failure(
            "output_changed", f"vs trial {reference['trial']}: {summary}"[:1000],
            f"this configuration changes the model's answers (flip rate above {r.max_flip_rate}): keep the "
            "baseline's kv-cache-dtype / dtype / attention backend / speculative-config, or raise "
            "regression.max_flip_rate"))
    return result


def _compared(reference: list, candidate: list, speculates: bool) -> tuple[dict, float, str]:
    """(the stored record, the flip rate the gate holds to its limit, the summary): for a speculating
    trial with batched answers, the flips speculation adds at equal batch sizes apart from batching's."""
    alone = regression.compare(*(split(reference)[0], split(candidate)[0]))
    found = speculation_check.check(reference, candidate) if speculates else None
    if found is None:
        return alone.to_dict(), alone.flip_rate, alone.summary()
    # `flip_rate` is the rate the gate held (what the diagnosis reads); the alone-only rate is kept beside it
    record = {**alone.to_dict(), "alone_flip_rate": alone.flip_rate, "flip_rate": found.flip_rate,
              "speculation": found.to_dict()}
    return record, found.flip_rate, found.summary()


def asked_for(cfg) -> dict:
    """What a reference must have answered to be comparable: the prompts (a digest), max_tokens, top_k."""
    prompts, max_tokens, top_k, batch = trial_spec_part(cfg)
    digest = hashlib.sha256("\n\0".join(prompts).encode()).hexdigest()[:16]
    return {"prompts_sha256": digest, "max_tokens": max_tokens, "top_k": top_k, "batch": batch}


def hold_launches(study, cfg, running_trials) -> bool:
    """With a maximum flip rate, no trial starts beside the baseline while its answers (the reference)
    are pending: a trial compared with nothing could become the best unchecked."""
    r = cfg.regression
    return bool(r.enabled and r.max_flip_rate is not None and not of_study.has_regression_reference(study)
                and any(of_trial.is_baseline(t) for t in running_trials))


# ---- python -m optimizer regress ---------------------------------------------------------------


def answer(spec, prompts, max_tokens: int, top_k: int, batch: int = 1):
    """Boot the spec's server, answer the prompts (alone, then `batch` at a time when above 1), stop it:
    (outputs, '') or (None, why)."""
    server = VllmServer(spec.model, list(spec.vllm_args), Path(spec.log_path), env=spec.server_env(),
                        startup_timeout=spec.startup_timeout, shutdown_timeout=spec.shutdown_timeout)
    bind_free_cores(server)  # on CPU: clear of the cores other vLLM servers (production?) are bound to
    try:
        if not server.start():
            f = server.failure
            return None, f"{f.kind}: {f.evidence} (remedy: {f.remedy})" if f else "the server did not start"
        try:
            return regression.collect_both(server.base_url, spec.model, prompts, max_tokens, top_k, batch), ""
        except (RuntimeError, OSError, ValueError) as exc:
            return None, str(exc)[:500]
    finally:
        with shutdown.deferred():  # a signal now would skip the stop's escalation to SIGKILL
            server.stop()

