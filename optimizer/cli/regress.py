"""`regress`: compare a candidate configuration's greedy outputs with the baseline's on real servers.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import time
from dataclasses import replace
from pathlib import Path

from optimizer import shutdown
from optimizer.cli.common import STUDY_FLAGS, add_flags, load
from optimizer.config.candidate import parse_candidate
from optimizer.errors import ConfigError
from optimizer.outputs import compare as regression
from optimizer.outputs import speculation_check
from optimizer.outputs.gate import answer, speculating, trial_spec_part
from optimizer.outputs.speculation_check import split

NAME = "regress"
BOOTS_VLLM = True
INTERRUPTED = "interrupted: the running server was stopped; nothing was stored"


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
    add_flags(p, *STUDY_FLAGS)
    return p


def main(ns: argparse.Namespace, console) -> int:
    """`regress`: 0 when every candidate answered within --max-flip-rate (or none was given), 1 when
    one is above it or could not answer; raises ConfigError for bad input (exit 2)."""
    from optimizer.driver.plan import prepare  # noqa: PLC0415 - the study module pulls in Ray
    from optimizer.driver.progress import Progress  # noqa: PLC0415
    from optimizer.driver.store.driver_lock import RunState  # noqa: PLC0415

    overrides = {"regression.enabled": True}
    if ns.prompts is not None:
        overrides["regression.prompts"] = ns.prompts
    if ns.max_tokens is not None:
        overrides["regression.max_tokens"] = ns.max_tokens
    if ns.max_flip_rate is not None and not 0 <= ns.max_flip_rate <= 1:
        raise ConfigError(f"--max-flip-rate {ns.max_flip_rate}: a rate between 0 and 1, e.g. 0.05")
    if not ns.candidate:
        raise ConfigError("regress: no --candidate given; e.g. --candidate 'kv-cache-dtype=fp8'")
    candidates = [parse_candidate(c) for c in ns.candidate]  # exact knob names: vLLM abbreviates flags
    cfg = load(ns, overrides)
    plan = prepare(cfg)
    # One driver per storage, and its servers tagged: a study on this storage never runs beside
    # these boots, and a killed `regress` leaves nothing the next start does not stop.
    with RunState(plan.storage_url, cfg.artifacts_dir, cfg.study_name) as held:
        Progress(console).recovery(held.acquire())
        plan = replace(plan, server_env=tuple(held.server_env().items()))
        return _compare_all(ns, console, plan, candidates)


def _compare_all(ns, console, plan, candidates: list[dict]) -> int:
    from optimizer.driver.launch import make_spec  # noqa: PLC0415

    prompts, max_tokens, top_k, _ = trial_spec_part(plan.cfg)
    base = dict(plan.cfg.baseline or {})
    configs = [("baseline", base)] + [(f"candidate {i + 1}", {**base, **c}) for i, c in enumerate(candidates)]
    # With speculation in a candidate, every server also answers `batch` at a time (speculation_check.py).
    batch = plan.cfg.regression.batch if any(speculating(p) for _, p in configs[1:]) and not speculating(base) else 1
    console.print(f"Output check: {len(prompts)} prompts, {max_tokens} greedy tokens each, top-{top_k} logprobs, "
                  f"one prompt at a time{f' and {batch} at a time' if batch > 1 else ''}; {len(configs)} server boots")
    answers, report, worst = {}, [], 0.0
    for i, (name, params) in enumerate(configs):
        shutdown.check()  # a signal that came while the last server stopped
        spec = make_spec(i, plan, params, f"regress/{i}")  # its server.log: artifacts/<study>/regress/<i>/
        console.print(f"[bold]{name}[/]: {shlex.join(spec.vllm_args)}")
        t = time.monotonic()
        outputs, why = answer(spec, prompts, max_tokens, top_k, batch)
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
            gap = regression.median_gap(split(outputs)[0])
            if gap is not None:
                console.print(f"The baseline's median lead of its top-1 token over the runner-up: {gap:.3f} nats "
                              "(small: near-ties any numeric change can flip)")
            continue
        cmp = regression.compare(split(answers["baseline"])[0], split(outputs)[0])
        found = speculation_check.check(answers["baseline"], outputs) if speculating(params) else None
        worst = max(worst, found.flip_rate if found else cmp.flip_rate)
        console.print(f"{name} {changed}: {found.summary() if found else cmp.summary()}")
        batched = [(f, f" at batch {found.batch}") for f in found.batched.flips] if found else []
        for flip, where in ([(f, "") for f in cmp.flips] + batched)[:10]:
            margin = "beyond the top-k" if flip.margin is None else f"{flip.margin:.3f} nats"
            console.print(f"  prompt {flip.prompt}{where}: token {flip.position} {flip.reference} -> {flip.candidate}, "
                          f"baseline's margin {margin}")
        report.append({"name": name, "params": params, "changed": changed, **cmp.to_dict(),
                       **({"alone_flip_rate": cmp.flip_rate, "flip_rate": found.flip_rate,
                           "speculation": found.to_dict()} if found else {}),
                       "summary": found.summary() if found else cmp.summary()})
    out = Path(ns.out) if ns.out else plan.artifacts / "regress.json"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"prompts": list(prompts), "max_tokens": max_tokens, "top_k": top_k,
                                   "baseline": base, "batch": batch,
                                   "median_gap_nats": regression.median_gap(split(answers["baseline"])[0]),
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
