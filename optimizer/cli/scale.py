"""`scale`: the study's recommended configuration measured as replicas behind a real nginx, so
that `plan` uses the scaling it measured instead of assuming 1.0 (fleet/together.py).

    python -m optimizer scale --config examples/fleet.yaml --replicas 2

Everything that can be refused is refused before a boot (exit 2, nothing stored): fewer than 2
replicas, SLOs missing (goodput needs them), no nginx, the proxy's port taken, more devices than
this machine has. The measurement runs on this machine (the replicas and nginx are its
children, stopped with it); on a Ray cluster, submit it as a job to the node that should run it.
"""

from __future__ import annotations

import argparse
import datetime
from dataclasses import replace

from optimizer import shutdown
from optimizer.cli.common import STUDY_FLAGS, add_flags, load
from optimizer.errors import ConfigError
from optimizer.record import of_trial, remeasured

NAME = "scale"
BOOTS_VLLM = True
INTERRUPTED = "stopped: the replicas and nginx were stopped; nothing was stored"


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="measure N replicas of the best configuration behind nginx: the "
                              "scaling plan uses")
    p.add_argument("--replicas", type=int, default=2, help="replicas measured together (default 2)")
    p.add_argument("--trial", type=int, help="measure this trial's configuration, not the recommended one")
    p.add_argument("--repeats", type=int, default=2, help="runs of each side, alternated (default 2: the "
                   "interval needs repeated runs)")
    p.add_argument("--memory-fraction", type=float, help="on CPU: each replica's --gpu-memory-utilization, when "
                   "the trial's, times the replicas, is more than the node has (the refusal names one that fits)")
    p.add_argument("--proxy-port", type=int, default=0, help="the port nginx listens on, on 127.0.0.1 (default: "
                   "any free port)")
    add_flags(p, *STUDY_FLAGS, "--slo")
    return p


def main(ns: argparse.Namespace, console) -> int:
    """Measure, print, and store the scaling on the study; raises OptimizerError for bad input."""
    from optimizer.fleet import together  # noqa: PLC0415
    from optimizer.fleet.scaling import scaling_of, with_record  # noqa: PLC0415
    from optimizer.measure.noise import geomean  # noqa: PLC0415

    _check_flags(ns)
    study, number, spec, fleet_workload, directory, model = _what_to_measure(ns)
    say = lambda line: console.print(line, markup=False)  # noqa: E731
    say(f"Measuring trial {number}'s configuration as {ns.replicas} replicas behind nginx against one alone "
        f"({ns.repeats} run(s) each): vllm serve {model} {' '.join(spec.vllm_args)}")
    try:
        runs = together.measure(spec, fleet_workload, ns.replicas, directory, ns.repeats, ns.proxy_port, say)
    except RuntimeError as exc:  # a replica or nginx that did not start: what its log said; nothing stored
        say(f"Not measured: {exc} (logs in {directory}); nothing stored")
        return 1
    if min(runs.one + runs.fleet) <= 0:
        side = "one replica alone" if min(runs.one) <= 0 else f"the {ns.replicas} replicas behind nginx"
        say(f"Not stored: {side} held the SLOs at no rate in a run ({list(runs.one)} alone, {list(runs.fleet)} "
            "together, req/s); relax the SLOs or look at the logs in " + str(directory))
        return 1
    result = scaling_of(list(runs.one), list(runs.fleet), ns.replicas, number,
                        datetime.date.today().isoformat(), _data_parallel(study, ns.replicas))
    shutdown.check()  # a stop asked during the measurement: nothing stored
    remeasured.write_scaling(study, with_record(study, result))
    say(result.describe())
    if result.data_parallel:
        dp = result.data_parallel
        say(f"vLLM's own data parallel {ns.replicas} (one server, trial {dp['trial']}) carried {dp['goodput']:.3g} "
            f"req/s; {ns.replicas} replicas behind nginx {geomean(runs.fleet):.3g} req/s")
    say(f"Stored on the study: plan now plans each replica of a fleet of trial {number} at its rate x this scaling "
        "(at most 1.0)")
    return 0


def _check_flags(ns) -> None:
    if ns.memory_fraction is not None and not 0 < ns.memory_fraction <= 1:
        raise ConfigError(f"--memory-fraction {ns.memory_fraction:g}: give each replica's share of the node's memory, "
                          "above 0 and at most 1, e.g. 0.4")
    if ns.replicas < 2:
        raise ConfigError(f"--replicas {ns.replicas}: scaling compares several replicas with one; give 2 or more")
    if ns.repeats < 1:
        raise ConfigError(f"--repeats {ns.repeats}: give 1 or more (2 or more for an interval)")
    if not 0 <= ns.proxy_port < 65536:
        raise ConfigError(f"--proxy-port {ns.proxy_port}: give a TCP port (1-65535), or 0 for any free port")


def _what_to_measure(ns):
    """(study, trial number, the replicas' trial spec, the fleet's workload, the directory, the model),
    or ConfigError for anything that cannot be measured here: all of it before any boot."""
    from optimizer.driver.launch import make_spec  # noqa: PLC0415
    from optimizer.engine.device import read_node_memory  # noqa: PLC0415
    from optimizer.driver.plan import prepare  # noqa: PLC0415
    from optimizer.driver.store.finished_study import open_finished  # noqa: PLC0415
    from optimizer.fleet import proxy, together  # noqa: PLC0415
    from optimizer.fleet.capacity import measurement_from_study  # noqa: PLC0415
    from optimizer.verdict.recommendation import recommend  # noqa: PLC0415
    from optimizer.workload import Vocabulary, build_workload  # noqa: PLC0415

    cfg = load(ns)
    plan = prepare(cfg)
    if not plan.objective.slos:
        raise ConfigError("scale measures goodput (the highest rate at which the SLOs hold): give the study's SLOs "
                          "(objective.slos, or --slo 'ttft:500 tpot:50')")
    proxy.nginx_binary()
    if ns.proxy_port:
        proxy.check_port(ns.proxy_port)
    finished = open_finished(cfg, check_objective=False)
    study = finished.study
    number = measurement_from_study(study, ns.trial).trial
    trial = study.trials[number]
    rec = recommend(study) if ns.trial is None else None
    args = list(rec.args) if rec is not None and rec.trial.number == number else of_trial.vllm_args(trial)
    spec = replace(make_spec(number, plan, dict(trial.params), f"scale-{number}"), vllm_args=tuple(args),
                   mode="goodput")
    together.placements(args, ns.replicas)  # refused here, before any boot, when the machine is too small
    if ns.memory_fraction is not None:
        args = together.with_fraction(args, ns.memory_fraction)
        spec = replace(spec, vllm_args=tuple(args))
    if plan.device.kind == "cpu":
        together.memory_claims(args, ns.replicas, read_node_memory())  # before any boot: shared with production
    if not isinstance(getattr(cfg.workload, "requests", None), int):
        raise ConfigError(f"workload {cfg.workload.scenario}: scale draws N times the requests for N replicas, and "
                          "this workload has no `requests` count to multiply; use a scenario that has one")
    more = cfg.workload.model_copy(update={"requests": cfg.workload.requests * ns.replicas})
    fleet_workload = build_workload(more, Vocabulary(plan.model.vocab_size, plan.model.source, plan.model.max_positions))
    directory = plan.artifacts / f"scale-{number}"
    directory.mkdir(parents=True, exist_ok=True)
    return study, number, spec, fleet_workload, directory, finished.model


def _data_parallel(study, replicas: int) -> dict | None:
    """The study's best trial of vLLM's own data parallel at this size, as {"trial", "goodput"}."""
    from optimizer.fleet.topologies import params_of  # noqa: PLC0415

    best = None
    for t in study.get_trials(deepcopy=False):
        if t.state.name != "COMPLETE" or of_trial.is_repeat(t):
            continue
        p = params_of(t)
        sizes = [int(p.get(k) or 1) for k in ("tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size")]
        rate = of_trial.metrics(t).get("goodput_rate")
        if sizes == [1, 1, replicas] and rate and (best is None or rate > best["goodput"]):
            best = {"trial": t.number, "goodput": float(rate)}
    return best
