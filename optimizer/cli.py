"""Command line: `python -m optimizer run | daemon | report | plan | regress | sensitivity | workload | tiny-model`.

Every OptimizerError becomes one line on stderr and its exit code (2 for bad input);
nothing is written to the study before the configuration has been validated.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rich.console import Console

from . import shutdown
from .errors import OptimizerError
from .status import TOKEN_ENV

RUN_FLAGS = {  # CLI flag -> dotted config key
    "model": "model.path", "objective": "objective.name", "metric": "objective.metric", "slo": "objective.slos",
    "n_trials": "n_trials", "storage": "storage", "study_name": "study_name", "ray_address": "ray.address",
    "artifacts_dir": "artifacts_dir",
}


INTERRUPTED = {  # what Ctrl-C / SIGTERM leaves behind, per command
    "run": "interrupted: the running trial was told FAIL; re-run the same command to resume",
    "daemon": "interrupted: the running trial was told FAIL; re-run the same command to resume",
    "regress": "interrupted: the running server was stopped; nothing was stored",
    "sensitivity": "interrupted: the running server was stopped; the knobs measured so far are stored on the study",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m optimizer", description="Tune a vLLM server with Optuna and Ray.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run (or resume) a study")
    daemon = sub.add_parser("daemon", help="run the study, then keep watching the traffic and re-tune when it "
                            "changes; serves /healthz, /status and /metrics")
    run.add_argument("--config", help="study YAML (see examples/quickstart.yaml)")
    run.add_argument("--model", help="model directory or Hugging Face id")
    run.add_argument("--goal", choices=("chat", "batch", "agent"),
                     help="preset objective, SLOs and workload: chat (p95 TTFT first), batch (tokens/s), "
                     "agent (goodput under bursts); replaces the config's objective and workload")
    run.add_argument("--objective", help="throughput | latency | goodput | pareto")
    run.add_argument("--metric", help="the objective's metric, e.g. ttft_p95 for latency")
    run.add_argument("--slo", help="SLOs like vLLM's --goodput, ms: 'ttft:500 tpot:50' (p95; ttft_p99:300; "
                     "error:1 in %%): goodput's definition, or constraints on latency/throughput")
    run.add_argument("--no-precheck", action="store_true",
                     help="boot every configuration, even one the KV-cache estimate says cannot fit")
    run.add_argument("--n-trials", type=int, help="trials in the study, baseline included")
    run.add_argument("--storage", help="SQLAlchemy URL (default sqlite:///trials.db)")
    run.add_argument("--study-name")
    run.add_argument("--ray-address", help="join this Ray cluster (default: embedded local Ray)")
    run.add_argument("--artifacts-dir", help="where per-trial logs, request records and best.yaml go "
                     "(default: artifacts); give an absolute path in a Ray job")
    run.add_argument("--workload", help="a YAML file whose `workload:` section replaces the config's "
                     "(examples/workloads/)")
    run.add_argument("--skip-bad-rows", action="store_true", default=None,
                     help="replay a trace's good rows when some are malformed (they are listed)")
    run.add_argument("--new-study", action="store_true",
                     help="the study ran another workload/objective/model: start a separate one, keep the old")
    for flag in ("--config", "--model", "--n-trials", "--storage", "--study-name", "--ray-address", "--artifacts-dir"):
        src = next(a for a in run._actions if flag in a.option_strings)
        daemon.add_argument(flag, type=src.type, help=src.help)
    daemon.add_argument("--watch", help="a trace file, or a directory new trace files land in (daemon.watch)")
    daemon.add_argument("--status-host", help="address of the status API (default 127.0.0.1; any other "
                        f"needs a token: {TOKEN_ENV} or --status-token-file)")
    daemon.add_argument("--status-port", type=int, help="port of the status API (default 8321; 0: any free one)")
    daemon.add_argument("--status-token-file", help="a file holding the bearer token the status API asks for")
    show = sub.add_parser("workload", help="build the config's workload, write it to a file, print its shape")
    show.add_argument("--config", required=True)
    show.add_argument("--goal", choices=("chat", "batch", "agent"), help="the preset's workload")
    show.add_argument("--model", help="model directory or Hugging Face id")
    show.add_argument("--workload", help="a YAML file whose `workload:` section replaces the config's")
    show.add_argument("--skip-bad-rows", action="store_true", default=None)
    show.add_argument("--out", default=".", help="directory for workload-<hash>.jsonl (default: here)")
    tiny = sub.add_parser("tiny-model", help="write the tiny local demo model")
    tiny.add_argument("directory")
    tiny.add_argument("--weights", action="store_true", help="also write seeded random weights (model.safetensors), "
                      "served without --load-format dummy: for the output check (regress)")
    report = sub.add_parser("report", help="write a stored study's report: Markdown, HTML, pictures, best.yaml")
    report.add_argument("--out", help="directory for the report (default: artifacts/<study>/report)")
    sens = sub.add_parser("sensitivity", help="re-measure the best configuration with one knob moved at a time")
    sens.add_argument("--knobs", help="comma-separated knobs to move (default: every knob of the space)")
    sens.add_argument("--to", action="append", default=[], metavar="KNOB=VALUE",
                      help="the value a knob moves to (default: one step: x2 on a log range, a quarter of the "
                      "range otherwise, the next choice)")
    sens.add_argument("--repeats", type=int, default=0, help="extra runs of the best for its noise band "
                      "(default 0: its search run and confirmation re-measurements)")
    from . import capacity, outputcheck

    commands = [report, sens, capacity.register(sub), outputcheck.register(sub)]
    for command in (report, sens):  # the objective the study ran with, as `run` was given it
        for flag in ("--goal", "--objective", "--metric", "--slo", "--workload"):
            src = next(a for a in run._actions if flag in a.option_strings)
            command.add_argument(flag, choices=src.choices, help=src.help)
    for command in commands:
        for flag in ("--config", "--storage", "--study-name", "--artifacts-dir", "--model"):
            if not any(flag in a.option_strings for a in command._actions):
                src = next(a for a in run._actions if flag in a.option_strings)
                command.add_argument(flag, type=src.type, help=src.help)
    return p


def _run(ns: argparse.Namespace, console: Console) -> int:
    import optuna

    from .progress import Progress
    from .report import print_report
    from .study import prepare, run

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    cfg = _load(ns)
    plan = prepare(cfg, new_study=ns.new_study)
    _warn_relative_artifacts(cfg, console)
    study, plan = run(plan, Progress(console))
    summary = print_report(study, plan.model.source, plan.artifacts, plan.objective, console)
    _write_report(study, plan.model.source, plan.artifacts, plan.objective, plan.artifacts / "report", console)
    return 0 if summary.best is not None or summary.front else 1


def _write_report(study, model: str, artifacts: Path, objective, out: Path, console: Console) -> int:
    """The written report (reportfiles.py); a full disk is a note, never a failed run."""
    from .reportfiles import write_report

    try:
        files = write_report(study, model, artifacts, objective, out)
    except Exception as exc:  # noqa: BLE001 - a full disk, a picture that cannot be drawn: the study is fine
        from .errors import first_line

        why = getattr(exc, "strerror", None) or f"{type(exc).__name__}: {first_line(exc)}"
        console.print(f"[yellow]note[/]: the written report was not stored in {out} ({why})")
        return 1
    console.print(f"Report: {files.html} (and {files.markdown.name}, pictures beside them); "
                  f"dashboard: make dashboard")
    from .dashboard import save_study_note

    note = save_study_note(study, files.summary, files.html)
    if note:
        console.print(f"[yellow]note[/]: {note}")
    return 0


def _report(ns: argparse.Namespace, console: Console) -> int:
    import optuna

    from .finished import open_finished
    from .report import print_report

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    f = open_finished(_load(ns))
    out = Path(ns.out) if ns.out else f.artifacts / "report"
    summary = print_report(f.study, f.model, f.artifacts, f.objective, console)
    code = _write_report(f.study, f.model, f.artifacts, f.objective, out, console)
    return code if summary.best is not None or summary.front else 1


def _sensitivity(ns: argparse.Namespace, console: Console) -> int:
    import optuna

    from . import sensitivity
    from .errors import ConfigError
    from .finished import open_finished
    from .outputcheck import parse_candidate
    from .progress import Progress
    from .study import measuring, prepare, stamp_mismatch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if ns.repeats < 0:
        raise ConfigError(f"--repeats {ns.repeats}: a count of extra runs, 0 or more")
    cfg = _load(ns)
    plan = prepare(cfg)  # every check first; then the study
    f = open_finished(cfg)
    mismatch = stamp_mismatch(f.study, plan)
    if mismatch:
        raise ConfigError(f"study '{cfg.study_name}' was run with another {mismatch[0].replace('_', ' ')} "
                          f"({mismatch[1]}); pass the config it ran with: the moves must measure what it measured")
    knobs = [k.strip() for k in ns.knobs.split(",") if k.strip()] if ns.knobs else None
    to = parse_candidate(" ".join(ns.to)) if ns.to else None
    prepared = sensitivity.prepare_run(f.study, plan, knobs, to)  # bad knobs are refused before Ray starts
    progress = Progress(console)
    with measuring(plan, progress) as measure:
        rows = sensitivity.run(f.study, plan, progress, measure, prepared, ns.repeats)
    return 0 if any(r["value"] is not None for r in rows) else 1


def _warn_relative_artifacts(cfg, console: Console) -> None:
    """In a Ray job run from an uploaded working dir, a relative artifacts_dir lands in the job's
    temporary copy (like a relative SQLite path, which is refused): the logs would go with it."""
    from pathlib import Path

    from .runtime import job_working_dir

    if job_working_dir() and not Path(cfg.artifacts_dir).expanduser().is_absolute():
        console.print(f"[yellow]warning[/]: artifacts_dir '{cfg.artifacts_dir}' is relative, and this runs as a Ray "
                      "job whose working directory is a temporary copy: its logs and best.yaml go with the job; "
                      "pass --artifacts-dir with an absolute path to keep them")


def _load(ns: argparse.Namespace, extra: dict | None = None):
    """The config file with the command line's flags (and `extra` dotted keys) applied; raises ConfigError."""
    from .config import load_config, read_yaml
    from .errors import ConfigError

    out = {}
    if getattr(ns, "goal", None):
        from .presets import preset

        sections = preset(ns.goal)
        out["objective"] = sections["objective"]
        out["workload"] = sections["workload"]
    out.update({key: getattr(ns, flag) for flag, key in RUN_FLAGS.items() if getattr(ns, flag, None) is not None})
    if out.get("objective.name") and "objective" in out:
        out["objective"] = {}  # an explicit --objective replaces the preset's, SLOs and all
    if getattr(ns, "no_precheck", False):
        out["precheck"] = False
    if getattr(ns, "model", None) is not None:
        out["model.tiny"] = False  # a model named on the command line is never generated over
    if getattr(ns, "workload", None) is not None:
        section = read_yaml(ns.workload)
        section = section.get("workload", section)
        if not isinstance(section, dict):
            raise ConfigError(f"--workload {ns.workload}: 'workload' must be a mapping with a scenario and its "
                              "knobs (see examples/workloads/)")
        out["workload"] = section
    out.update(extra or {})
    cfg = load_config(ns.config, out)
    if getattr(ns, "skip_bad_rows", None):
        if cfg.workload.scenario != "trace":
            raise ConfigError(f"--skip-bad-rows applies to scenario 'trace' only (this workload is "
                              f"'{cfg.workload.scenario}'); drop the flag")
        cfg = cfg.model_copy(update={"workload": cfg.workload.model_copy(update={"skip_bad_rows": True})})
    return cfg


def _daemon(ns: argparse.Namespace, console: Console) -> int:
    import optuna

    from .daemon import Daemon

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cfg = _load(ns)
    d = cfg.daemon.model_copy(update={k: v for k, v in (("watch", ns.watch), ("status_host", ns.status_host),
                                                        ("status_port", ns.status_port)) if v is not None})
    cfg = cfg.model_copy(update={"daemon": d})
    return Daemon(cfg, console, d.status_host, d.status_port, _token(ns.status_token_file)).run()


def _token(path: str | None) -> str | None:
    """The status API's bearer token: from --status-token-file, else the environment (never a flag's
    value: that would show in `ps`)."""
    from .errors import ConfigError

    if path:
        try:
            token = Path(path).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"--status-token-file {path}: cannot read it ({exc.strerror}); check the path") from exc
        if not token:
            raise ConfigError(f"--status-token-file {path}: the file is empty; put the token in it")
        return token
    return os.environ.get(TOKEN_ENV) or None


def _workload(ns: argparse.Namespace, console: Console) -> int:
    from .study import load_workload
    from .workload.materialize import write_workload
    from .workload.stats import describe

    _, workload = load_workload(_load(ns))
    path = write_workload(workload, Path(ns.out))
    for line in describe(workload):
        console.print(line)
    console.print(f"written to {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    # SIGTERM, SIGINT and SIGHUP stop the running server, tell its trial FAIL and queue it again.
    shutdown.install()
    # soft_wrap: never break a line (a wrapped `vllm serve` command cannot be pasted)
    console = Console(highlight=False, soft_wrap=True)
    try:
        if ns.command == "tiny-model":
            from .tinymodel import write_tiny_model

            print(write_tiny_model(ns.directory, weights=ns.weights))
            return 0
        if ns.command == "workload":
            return _workload(ns, console)
        if ns.command == "daemon":
            return _daemon(ns, console)
        if ns.command == "report":
            return _report(ns, console)
        if ns.command == "sensitivity":
            return _sensitivity(ns, console)
        if ns.command == "plan":
            from .capacity import main as plan_main

            return plan_main(ns, console, _load)
        if ns.command == "regress":
            from .outputcheck import main as regress_main

            return regress_main(ns, console, _load)
        return _run(ns, console)
    except OptimizerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(INTERRUPTED.get(ns.command, INTERRUPTED["run"]), file=sys.stderr)
        return 130
