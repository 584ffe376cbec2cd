"""Command line: `python -m optimizer run | tiny-model`.

Every OptimizerError becomes one line on stderr and its exit code (2 for bad input);
nothing is written to the study before the configuration has been validated.
"""

from __future__ import annotations

import argparse
import signal
import sys

from rich.console import Console

from .errors import OptimizerError

RUN_FLAGS = {  # CLI flag -> dotted config key
    "model": "model.path", "objective": "objective.name", "metric": "objective.metric",
    "n_trials": "n_trials", "storage": "storage", "study_name": "study_name", "ray_address": "ray.address",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m optimizer", description="Tune a vLLM server with Optuna and Ray.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run (or resume) a study")
    run.add_argument("--config", help="study YAML (see examples/quickstart.yaml)")
    run.add_argument("--model", help="model directory or Hugging Face id")
    run.add_argument("--objective", help="throughput | latency")
    run.add_argument("--metric", help="the objective's metric, e.g. ttft_p95 for latency")
    run.add_argument("--n-trials", type=int, help="trials in the study, baseline included")
    run.add_argument("--storage", help="SQLAlchemy URL (default sqlite:///trials.db)")
    run.add_argument("--study-name")
    run.add_argument("--ray-address", help="join this Ray cluster (default: embedded local Ray)")
    tiny = sub.add_parser("tiny-model", help="write the tiny local demo model")
    tiny.add_argument("directory")
    return p


def _run(ns: argparse.Namespace, console: Console) -> int:
    import optuna

    from .config import load_config
    from .progress import Progress
    from .report import print_report
    from .study import prepare, run

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    overrides = {key: getattr(ns, flag) for flag, key in RUN_FLAGS.items() if getattr(ns, flag) is not None}
    if ns.model is not None:
        overrides["model.tiny"] = False  # a model named on the command line is never generated over
    cfg = load_config(ns.config, overrides)
    plan = prepare(cfg)
    study = run(plan, Progress(console))
    summary = print_report(study, plan.model.source, plan.artifacts, plan.objective, console)
    return 0 if summary.best is not None else 1


def _terminate_as_interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    # SIGTERM (kill, a CI cancel) and SIGHUP (a closed terminal) stop like Ctrl-C: the
    # running server is stopped and the trial is told FAIL and queued again.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _terminate_as_interrupt)
    # soft_wrap: never break a line (a wrapped `vllm serve` command cannot be pasted)
    console = Console(highlight=False, soft_wrap=True)
    try:
        if ns.command == "tiny-model":
            from .tinymodel import write_tiny_model

            print(write_tiny_model(ns.directory))
            return 0
        return _run(ns, console)
    except OptimizerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted: the running trial was told FAIL; re-run the same command to resume", file=sys.stderr)
        return 130
