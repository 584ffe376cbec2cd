"""A workload on disk: written once per content hash, read back identical.

`workload-<hash12>.jsonl` holds a header line (hash, name, description, schedule, notes)
and one line per request (warm-up first). The study stores the file's path and the hash:
the exact requests every trial replayed stay inspectable after the study, and a resumed
study with another workload is refused (driver/plan.py).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from optimizer.errors import ConfigError, OptimizerError
from optimizer.workload.base import Request, Workload


def workload_path(workload: Workload, directory: Path) -> Path:
    return Path(directory) / f"workload-{workload.content_hash()[:12]}.jsonl"


def write_workload(workload: Workload, directory: Path) -> Path:
    """Write the workload unless a file with its hash is already there; returns the path."""
    path = workload_path(workload, directory)
    if path.is_file():
        return path
    header = {"hash": workload.content_hash(), "name": workload.name, "description": workload.description,
              "concurrency": workload.concurrency, "notes": list(workload.notes)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        with tmp.open("w") as f:
            f.write(json.dumps(header) + "\n")
            for phase, reqs in (("warmup", workload.warmup), ("measured", workload.requests)):
                for r in reqs:
                    f.write(json.dumps({"phase": phase, **asdict(r)}) + "\n")
        tmp.replace(path)
    except OSError as exc:
        raise OptimizerError(f"cannot write the workload file {path} ({exc.strerror}); free disk space or set "
                             "artifacts_dir") from exc
    return path


def read_workload(path: str | Path) -> Workload:
    """Read a file `write_workload` wrote; raises ConfigError if it is damaged or its hash is wrong."""
    p = Path(path)
    try:
        lines = p.read_text().splitlines()
        header = json.loads(lines[0])
        rows = [json.loads(line) for line in lines[1:]]
        phases = {"warmup": [], "measured": []}
        for row in rows:
            phase = row.pop("phase")
            row["prompt_token_ids"] = tuple(row["prompt_token_ids"])
            phases[phase].append(Request(**row))
        w = Workload(header["name"], tuple(phases["measured"]), tuple(phases["warmup"]), header["concurrency"],
                     header["description"], tuple(header["notes"]))
        stored = header["hash"]
    except (OSError, IndexError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"workload file {p}: cannot read it ({type(exc).__name__}); write it again") from exc
    if w.content_hash() != stored:
        raise ConfigError(f"workload file {p}: content does not match its hash; it was edited or damaged")
    return w
