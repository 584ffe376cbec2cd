"""What every command shares: the study flags (one definition each) and the config they build.

A command adds the flags it takes with `add_flags`; `load(ns)` reads the config file and applies
the command line's flags on top, raising ConfigError for anything bad (nothing is written first).
"""

from __future__ import annotations

import argparse

RUN_FLAGS = {  # CLI flag -> dotted config key
    "model": "model.path", "objective": "objective.name", "metric": "objective.metric", "slo": "objective.slos",
    "n_trials": "n_trials", "storage": "storage", "study_name": "study_name", "ray_address": "ray.address",
    "artifacts_dir": "artifacts_dir",
}

GOALS = ("chat", "batch", "agent")

FLAGS = {  # flag -> argparse keywords, shared by every command that takes it
    "--config": dict(help="study YAML (see examples/quickstart.yaml)"),
    "--model": dict(help="model directory or Hugging Face id"),
    "--goal": dict(choices=GOALS, help="preset objective, SLOs and workload: chat (p95 TTFT first), batch "
                   "(tokens/s), agent (goodput under bursts); replaces the config's objective and workload"),
    "--objective": dict(help="throughput | latency | goodput | pareto"),
    "--metric": dict(help="the objective's metric, e.g. ttft_p95 for latency"),
    "--slo": dict(help="SLOs like vLLM's --goodput, ms: 'ttft:500 tpot:50' (p95; ttft_p99:300; error:1 in %%): "
                  "goodput's definition, or constraints on latency/throughput"),
    "--n-trials": dict(type=int, help="trials in the study, baseline included"),
    "--storage": dict(help="SQLAlchemy URL (default sqlite:///trials.db)"),
    "--study-name": dict(),
    "--ray-address": dict(help="join this Ray cluster (default: embedded local Ray)"),
    "--artifacts-dir": dict(help="where per-trial logs, request records and best.yaml go (default: artifacts); "
                            "give an absolute path in a Ray job"),
    "--workload": dict(help="a YAML file whose `workload:` section replaces the config's (examples/workloads/)"),
}

# The objective a stored study ran with, as `run` was given it (report and sensitivity take these).
OBJECTIVE_FLAGS = ("--goal", "--objective", "--metric", "--slo", "--workload")
# Where a stored study is (every command that reads one takes these).
STUDY_FLAGS = ("--config", "--storage", "--study-name", "--artifacts-dir", "--model")


def add_flags(parser: argparse.ArgumentParser, *flags: str) -> None:
    """Add each shared flag the parser does not have yet."""
    for flag in flags:
        if not any(flag in a.option_strings for a in parser._actions):
            parser.add_argument(flag, **FLAGS[flag])


def load(ns: argparse.Namespace, extra: dict | None = None):
    """The config file with the command line's flags (and `extra` dotted keys) applied; raises ConfigError."""
    from optimizer.config.schema import load_config

    _check_slo_flag(getattr(ns, "slo", None))
    out = _goal_sections(ns)
    given = {flag: key for flag, key in RUN_FLAGS.items() if getattr(ns, flag, None) is not None}
    out.update({key: getattr(ns, flag) for flag, key in given.items()})
    # a bad value is reported against the flag that gave it, not the config file
    flags = {key: "--" + flag.replace("_", "-") for flag, key in given.items() if key not in (extra or {})}
    if out.get("objective.name") and "objective" in out:
        out["objective"] = {}  # an explicit --objective replaces the preset's, SLOs and all
    if getattr(ns, "no_precheck", False):
        out["precheck"] = False
    if getattr(ns, "no_minimal", False):
        out["confirm.minimal"] = False
    if getattr(ns, "model", None) is not None:
        out["model.tiny"] = out["model.smollm2"] = False  # a model named on the command line is never generated over
    if getattr(ns, "workload", None) is not None:
        out["workload"] = _workload_section(ns.workload)
    out.update(extra or {})
    cfg = load_config(ns.config, out, flags)
    if getattr(ns, "skip_bad_rows", None):
        cfg = _skip_bad_rows(cfg)
    return cfg


def _check_slo_flag(slo: str | None) -> None:
    """`--slo ''` would replace the config's (or the goal's) SLOs with none, silently: refused."""
    import shlex

    from optimizer.errors import ConfigError

    if slo is not None and not slo.replace(",", " ").strip():
        raise ConfigError(f"--slo {shlex.quote(slo)}: empty; give SLOs like 'ttft:500 tpot:50', or leave the flag "
                          "out to keep the config's")


def _goal_sections(ns: argparse.Namespace) -> dict:
    if not getattr(ns, "goal", None):
        return {}
    from optimizer.config.presets import preset

    sections = preset(ns.goal)
    return {"objective": sections["objective"], "workload": sections["workload"]}


def _workload_section(path: str) -> dict:
    from optimizer.config.schema import read_yaml
    from optimizer.errors import ConfigError

    section = read_yaml(path)
    section = section.get("workload", section)
    if not isinstance(section, dict):
        raise ConfigError(f"--workload {path}: 'workload' must be a mapping with a scenario and its "
                          "knobs (see examples/workloads/)")
    return section


def _skip_bad_rows(cfg):
    from optimizer.errors import ConfigError

    if cfg.workload.scenario != "trace":
        raise ConfigError(f"--skip-bad-rows applies to scenario 'trace' only (this workload is "
                          f"'{cfg.workload.scenario}'); drop the flag")
    return cfg.model_copy(update={"workload": cfg.workload.model_copy(update={"skip_bad_rows": True})})
