"""The command line's entry: one parser, every command registered the same way, one error rule.

Every OptimizerError becomes one line on stderr and its exit code (2 for bad input); a stop
signal prints what the command left behind and exits 130 (the daemon 0), and the exit then skips
the interpreter's last garbage collection.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import sys
from pathlib import Path

from rich.console import Console

from optimizer import shutdown
from optimizer.cli import (
    daemon,
    plan,
    regress,
    report,
    run,
    scale,
    sensitivity,
    simulate,
    tiny_model,
    workload,
)
from optimizer.engine.vllm_version import check_vllm_version
from optimizer.errors import OptimizerError

COMMANDS = {m.NAME: m for m in (run, daemon, report, plan, simulate, scale, regress, sensitivity, workload, tiny_model)}


def parser() -> argparse.ArgumentParser:
    prog = "vllm-optimizer" if Path(sys.argv[0]).name == "vllm-optimizer" else "python -m optimizer"
    p = argparse.ArgumentParser(prog=prog, description="Tune a vLLM server with Optuna and Ray.")
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    command = COMMANDS[ns.command]
    # SIGTERM, SIGINT and SIGHUP stop the running server, tell its trial FAIL and queue it again.
    shutdown.install()
    # soft_wrap: never break a line (a wrapped `vllm serve` command cannot be pasted)
    console = Console(highlight=False, soft_wrap=True)
    try:
        if getattr(command, "BOOTS_VLLM", False):
            _warn_untested_vllm(console)
        return command.main(ns, console)
    except OptimizerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(getattr(command, "INTERRUPTED", run.INTERRUPTED), file=sys.stderr)
        return 130
    finally:
        if shutdown.requested.is_set():
            # A stop: the interpreter's last garbage collection at exit walks everything the run built
            # (measured: 2.6-14 s on a loaded 2-core machine; 0.5 s without it). What needs closing
            # was closed on the way out (the storage, Ray, the servers); the kernel frees the rest.
            atexit.register(gc.freeze)


def _warn_untested_vllm(console: Console) -> None:
    """One line when the installed vLLM is not the release the classifier and knob rules follow."""
    warning = check_vllm_version()
    if warning:
        console.print(warning, style="yellow", markup=False)
