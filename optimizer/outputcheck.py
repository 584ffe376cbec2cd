"""The output-regression check in use: the prompt set a study asks for, the study's gate (a trial's
greedy outputs against the baseline's), and `python -m optimizer regress`.

In a study (`regression: {enabled: true, max_flip_rate: ...}`) every measured trial answers the
prompt set after its replay (trial.py). The baseline's answers become the study's reference
(study user attribute `regression_reference`); every later trial is compared with them
(regression.compare) and the comparison stored on it (`regression`). Above `max_flip_rate` the
trial is PRUNED as `output_changed`: it cannot become the best. A trial measured before the
baseline's answers exist (parallel trials) is compared with nothing and says so.

`regress` boots the baseline and each candidate in turn in this process (no Ray: on a cluster,
submit it as a job on a GPU node, `ray job submit --entrypoint-num-gpus N -- python -m optimizer
regress ...`), answers the prompt set on each, and prints each candidate's comparison.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
from dataclasses import replace
from pathlib import Path

from . import regression, shutdown
from .engine.failures import Failure
from .engine.vllm import VllmServer
from .errors import ConfigError
from .space import KNOBS, from_cli_args

REFERENCE = "regression_reference"  # study user attribute: the baseline's answers


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
    """What TrialSpec.regression carries for this config: (prompts, max_tokens, top_k), or None."""
    r = cfg.regression
    return (prompt_set(r), r.max_tokens, r.top_k) if r.enabled else None


def gate(study, trial, result, cfg):
    """Before the tell: keep the baseline's answers as the reference, or compare a trial's with
    them (stored on the trial) and fail it `output_changed` above the maximum flip rate."""
    r = cfg.regression
    if not r.enabled or result.failure is not None:
        return result
    if result.outputs_error or not result.outputs:
        trial.set_user_attr("regression", {"summary": f"not checked: {result.outputs_error or 'no outputs'}"})
        return result
    asked = asked_for(cfg)
    if trial.user_attrs.get("baseline"):
        study.set_user_attr(REFERENCE, {"trial": trial.number, "outputs": list(result.outputs), **asked})
        if r.max_flip_rate is not None:
            study.set_user_attr("max_flip_rate", r.max_flip_rate)  # diagnosis.Context reads it
        trial.set_user_attr("regression", {"summary": "the reference: the other trials' outputs are compared with these"})
        return result
    reference = study.user_attrs.get(REFERENCE)
    if not reference:
        trial.set_user_attr("regression", {"summary": "not compared: the baseline's outputs are not recorded (it "
                                                      "did not finish first, failed, or ran before the check was on)"})
        return result
    if any(reference.get(k) != v for k, v in asked.items()):
        trial.set_user_attr("regression", {"summary": "not compared: the baseline answered another prompt set, "
                                                      "max_tokens or top_k (the config's regression section changed)"})
        return result
    try:
        cmp = regression.compare([regression.Output.from_dict(o) for o in reference["outputs"]],
                                 [regression.Output.from_dict(o) for o in result.outputs])
    except ValueError as exc:  # another prompt set than the reference's (the config changed)
        trial.set_user_attr("regression", {"summary": f"not compared: {exc}"})
        return result
    record = {**cmp.to_dict(), "summary": cmp.summary(), "reference_trial": reference["trial"],
              "max_flip_rate": r.max_flip_rate}
    trial.set_user_attr("regression", record)
    if r.max_flip_rate is not None and regression.exceeds(cmp, r.max_flip_rate):
        return replace(result, failure=Failure(
            "output_changed", f"vs trial {reference['trial']}: {cmp.summary()}"[:1000],
            f"this configuration changes the model's answers (flip rate above {r.max_flip_rate}): keep the "
            "baseline's kv-cache-dtype / dtype / attention backend, or raise regression.max_flip_rate"))
    return result


def asked_for(cfg) -> dict:
    """What a reference must have answered to be comparable: the prompts (a digest), max_tokens, top_k."""
    prompts, max_tokens, top_k = trial_spec_part(cfg)
    digest = hashlib.sha256("\n\0".join(prompts).encode()).hexdigest()[:16]
    return {"prompts_sha256": digest, "max_tokens": max_tokens, "top_k": top_k}


def hold_launches(study, cfg, running_trials) -> bool:
    """With a maximum flip rate, no trial starts beside the baseline while its answers (the reference)
    are pending: a trial compared with nothing could become the best unchecked."""
    r = cfg.regression
    return bool(r.enabled and r.max_flip_rate is not None and REFERENCE not in study.user_attrs
                and any(t.user_attrs.get("baseline") for t in running_trials))


# ---- python -m optimizer regress ---------------------------------------------------------------

def register(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("regress", help="compare greedy outputs of candidate configurations with the baseline's")
    p.add_argument("--config", help="study YAML: its model, baseline, engine flags and `regression` section")
    p.add_argument("--model", help="model directory or id (overrides the config)")
    p.add_argument("--candidate", action="append", default=[], metavar="FLAGS",
                   help="knobs changed from the baseline, e.g. 'kv-cache-dtype=fp8' or "
                        "'kv-cache-dtype=fp8 max-num-seqs=32' (repeatable)")
    p.add_argument("--max-flip-rate", type=float, help="exit 1 if a candidate's top-1 flip rate is above this")
    p.add_argument("--prompts", type=int, help="how many prompts (default: the config's regression.prompts)")
    p.add_argument("--max-tokens", type=int, help="greedy tokens per prompt (default: regression.max_tokens)")
    p.add_argument("--out", help="write every comparison here as JSON (default: artifacts/<study>/regress.json)")
    return p


def parse_candidate(text: str) -> dict:
    """'kv-cache-dtype=fp8 max-num-seqs=32' -> {'kv-cache-dtype': 'fp8', 'max-num-seqs': 32}: typed as
    the space types each knob (true/false for an on/off knob); raises ConfigError."""
    out = {}
    for item in text.replace(",", " ").split():
        key, eq, value = item.removeprefix("--").partition("=")
        if not eq or not key or not value:
            raise ConfigError(f"--candidate '{text}': '{item}' is not knob=value; write e.g. 'kv-cache-dtype=fp8'")
        out[key] = _typed(key, value, text)
    if not out:
        raise ConfigError("--candidate '': give the knobs that differ from the baseline, e.g. 'kv-cache-dtype=fp8'")
    return out


def _typed(key: str, value: str, text: str):
    knob = KNOBS.get(key)
    if knob is None:
        return value  # a flag this project does not tune: passed to vLLM as written
    if knob.kind == "bool":
        if value.lower() not in BOOLS:
            raise ConfigError(f"--candidate '{text}': {key} is on or off; write {key}=true or {key}=false")
        return BOOLS[value.lower()]
    try:
        return from_cli_args([f"--{key}", value])[key]
    except ValueError:
        raise ConfigError(f"--candidate '{text}': {key}={value} is not a {'whole number' if knob.kind == 'int' else 'number'}"
                          f"; write e.g. {key}={'32' if knob.kind == 'int' else '0.5'}") from None


BOOLS = {"true": True, "on": True, "1": True, "yes": True, "false": False, "off": False, "0": False, "no": False}


def main(ns: argparse.Namespace, console, load) -> int:
    """`regress`: 0 when every candidate answered within --max-flip-rate (or none was given), 1 when
    one is above it or could not answer; raises ConfigError for bad input (exit 2)."""
    from .progress import Progress  # noqa: PLC0415
    from .runstate import RunState  # noqa: PLC0415
    from .study import prepare  # noqa: PLC0415 - the study module pulls in Ray

    overrides = {"regression.enabled": True}
    if ns.prompts is not None:
        overrides["regression.prompts"] = ns.prompts
    if ns.max_tokens is not None:
        overrides["regression.max_tokens"] = ns.max_tokens
    if ns.max_flip_rate is not None and not 0 <= ns.max_flip_rate <= 1:
        raise ConfigError(f"--max-flip-rate {ns.max_flip_rate}: a rate between 0 and 1, e.g. 0.05")
    if not ns.candidate:
        raise ConfigError("regress: no --candidate given; e.g. --candidate 'kv-cache-dtype=fp8'")
    cfg = load(ns, overrides)
    candidates = [parse_candidate(c) for c in ns.candidate]
    plan = prepare(cfg)
    # One driver per storage, and its servers tagged: a study on this storage never runs beside
    # these boots, and a killed `regress` leaves nothing the next start does not stop.
    with RunState(plan.storage_url, cfg.artifacts_dir) as held:
        Progress(console).recovery(held.acquire())
        plan = replace(plan, server_env=tuple(held.server_env().items()))
        return _compare_all(ns, console, plan, candidates)


def _compare_all(ns, console, plan, candidates: list[dict]) -> int:
    from .study import make_spec  # noqa: PLC0415

    prompts, max_tokens, top_k = trial_spec_part(plan.cfg)
    base = dict(plan.cfg.baseline or {})
    configs = [("baseline", base)] + [(f"candidate {i + 1}", {**base, **c}) for i, c in enumerate(candidates)]
    console.print(f"Output check: {len(prompts)} prompts, {max_tokens} greedy tokens each, top-{top_k} logprobs, "
                  f"one prompt at a time; {len(configs)} server boots")
    answers, report, worst = {}, [], 0.0
    for i, (name, params) in enumerate(configs):
        shutdown.check()  # a signal that came while the last server stopped
        spec = make_spec(i, plan, params, f"regress/{i}")  # its server.log: artifacts/<study>/regress/<i>/
        console.print(f"[bold]{name}[/]: {' '.join(spec.vllm_args)}")
        t = time.monotonic()
        outputs, why = answer(spec, prompts, max_tokens, top_k)
        changed = {k: v for k, v in params.items() if base.get(k) != v} or "(same as the baseline)"
        if outputs is None:
            console.print(f"  [red]could not answer[/]: {why} (log: {spec.log_path})")
            if i == 0:
                console.print("[red]no reference[/]: the baseline must answer first; fix it, then run again")
                return 1
            report.append({"name": name, "params": params, "changed": changed, "error": why})
            worst = math.inf
            continue
        console.print(f"  answered in {time.monotonic() - t:.0f} s (boot included)")
        answers[name] = outputs
        if i == 0:
            gap = regression.median_gap(outputs)
            if gap is not None:
                console.print(f"The baseline's median lead of its top-1 token over the runner-up: {gap:.3f} nats "
                              "(small: near-ties any numeric change can flip)")
            continue
        cmp = regression.compare(answers["baseline"], outputs)
        worst = max(worst, cmp.flip_rate)
        console.print(f"{name} {changed}: {cmp.summary()}")
        for flip in cmp.flips[:10]:
            margin = "beyond the top-k" if flip.margin is None else f"{flip.margin:.3f} nats"
            console.print(f"  prompt {flip.prompt}: token {flip.position} {flip.reference} -> {flip.candidate}, "
                          f"baseline's margin {margin}")
        report.append({"name": name, "params": params, "changed": changed, **cmp.to_dict(), "summary": cmp.summary()})
    out = Path(ns.out) if ns.out else plan.artifacts / "regress.json"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"prompts": list(prompts), "max_tokens": max_tokens, "top_k": top_k,
                                   "baseline": base, "median_gap_nats": regression.median_gap(answers["baseline"]),
                                   "candidates": report,
                                   "outputs": {n: [o.to_dict() for o in o_list] for n, o_list in answers.items()}},
                                  indent=1, default=str))
        console.print(f"written to {out}")
    except OSError as exc:
        console.print(f"[yellow]note[/]: {out} not written ({exc.strerror or exc})")
    if math.isinf(worst):
        console.print("[red]incomplete[/]: a candidate could not answer (see above)")
        return 1
    if ns.max_flip_rate is not None and worst > ns.max_flip_rate:
        console.print(f"[red]regression[/]: a candidate's flip rate {worst:.3f} is above {ns.max_flip_rate}")
        return 1
    return 0


def answer(spec, prompts, max_tokens: int, top_k: int):
    """Boot the spec's server, answer the prompts, stop it: (outputs, '') or (None, why)."""
    server = VllmServer(spec.model, list(spec.vllm_args), Path(spec.log_path), env=dict(spec.env),
                        startup_timeout=spec.startup_timeout, shutdown_timeout=spec.shutdown_timeout)
    try:
        if not server.start():
            f = server.failure
            return None, f"{f.kind}: {f.evidence} (remedy: {f.remedy})" if f else "the server did not start"
        try:
            return regression.collect(server.base_url, spec.model, prompts, max_tokens=max_tokens, top_k=top_k), ""
        except (RuntimeError, OSError, ValueError) as exc:
            return None, str(exc)[:500]
    finally:
        with shutdown.deferred():  # a signal now would skip the stop's escalation to SIGKILL
            server.stop()
