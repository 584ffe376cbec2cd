"""`daemon`: run the study, then keep watching the traffic and re-tune when it changes."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from optimizer.cli.common import add_flags, load
from optimizer.daemon.status_api import TOKEN_ENV

NAME = "daemon"
BOOTS_VLLM = True
INTERRUPTED = "interrupted: the running trial was told FAIL; re-run the same command to resume"


def register(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(NAME, help="run the study, then keep watching the traffic and re-tune when it "
                       "changes; serves /healthz, /status and /metrics")
    add_flags(p, "--config", "--model", "--n-trials", "--storage", "--study-name", "--ray-address", "--artifacts-dir")
    p.add_argument("--watch", help="a trace file, or a directory new trace files land in (daemon.watch)")
    p.add_argument("--status-host", help="address of the status API (default 127.0.0.1; any other "
                   f"needs a token: {TOKEN_ENV} or --status-token-file)")
    p.add_argument("--status-port", type=int, help="port of the status API (default 8321; 0: any free one)")
    p.add_argument("--status-token-file", help="a file holding the bearer token the status API asks for")
    return p


def main(ns: argparse.Namespace, console) -> int:
    from optimizer.daemon.loop import Daemon
    from optimizer.report import dashboard_notes
    from optimizer.report.console import print_report

    cfg = load(ns)
    d = cfg.daemon.model_copy(update={k: v for k, v in (("watch", ns.watch), ("status_host", ns.status_host),
                                                        ("status_port", ns.status_port)) if v is not None})
    cfg = cfg.model_copy(update={"daemon": d})
    return Daemon(cfg, console, d.status_host, d.status_port, _token(ns.status_token_file),
                  dashboard=dashboard_notes, report=print_report).run()


def _token(path: str | None) -> str | None:
    """The status API's bearer token: from --status-token-file, else the environment (never a flag's
    value: that would show in `ps`)."""
    from optimizer.errors import ConfigError

    if path:
        try:
            token = Path(path).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"--status-token-file {path}: cannot read it ({exc.strerror}); check the path") from exc
        if not token:
            raise ConfigError(f"--status-token-file {path}: the file is empty; put the token in it")
        return token
    return os.environ.get(TOKEN_ENV) or None
