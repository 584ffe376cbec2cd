"""`workload`: build the config's workload, write it to a file, print its shape."""

from __future__ import annotations

import argparse
from pathlib import Path

from optimizer.cli.common import add_flags, load

NAME = "workload"


def register(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(NAME, help="build the config's workload, write it to a file, print its shape")
    p.add_argument("--config", required=True)
    p.add_argument("--goal", choices=("chat", "batch", "agent"), help="the preset's workload")
    add_flags(p, "--model")
    p.add_argument("--workload", help="a YAML file whose `workload:` section replaces the config's")
    p.add_argument("--skip-bad-rows", action="store_true", default=None)
    p.add_argument("--out", default=".", help="directory for workload-<hash>.jsonl (default: here)")
    return p


def main(ns: argparse.Namespace, console) -> int:
    from optimizer.config.paths import directory_expected
    from optimizer.driver.plan import load_workload
    from optimizer.workload.materialize import write_workload
    from optimizer.workload.stats import describe

    directory_expected(ns.out, "--out", "pass a directory for the workload file (created if missing)")
    _, workload = load_workload(load(ns))
    path = write_workload(workload, Path(ns.out))
    for line in describe(workload):
        console.print(line)
    console.print(f"written to {path}")
    return 0
