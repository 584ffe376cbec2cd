"""What the driver stores per trial, from what came back through Ray, and what a full disk does to it.

    artifacts/<study>/trial-<n>/server.log      the server's log (first line: the command). Written
                                                live by the trial when it runs on the driver's
                                                machine; from a trial on another node, the text
                                                its result carried back (no shared filesystem)
    artifacts/<study>/trial-<n>/requests.jsonl  one line per measured request: send time, first
                                                chunk, end, tokens, status (replay.RequestRecord)
    artifacts/<study>/trial-<n>/result.json     parameters, failure, metrics, phases, server view
    artifacts/<study>/trial-<n>/step_probe.json the step probe's timings, where the trial sent it
                                                (twin/probe.py: the baseline)

All written by the driver before it tells Optuna. A write that fails (a full disk, a quota)
fails that trial as `infra` with evidence starting "disk:", and the driver waits for space
before the next one; the study and the trials already told are never touched. Written
atomically (temporary file, then rename).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict
from pathlib import Path

from optimizer.engine.failures import Failure
from optimizer.engine.vllm import DISK_EVIDENCE

PROBE_BYTES = 64 * 1024  # free space needed before the next trial may start


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def store_trial(trial_dir: Path, params: dict, result, driver_host: str) -> Failure | None:
    """Everything the driver keeps of a trial: its request records, its server log when it ran on
    another node (or its local copy is missing), then `result.json`. A Failure (infra, disk) if
    the disk refuses any of it."""
    path = trial_dir / "requests.jsonl"
    try:
        if result.records:
            write_atomically(path, "".join(json.dumps(_finite(asdict(r)), sort_keys=True) + "\n"
                                           for r in result.records))
        path = trial_dir / "step_probe.json"
        if result.step_probe:
            write_atomically(path, json.dumps({"groups": _finite(list(result.step_probe))}))
        path = trial_dir / "server.log"
        if result.log_text and (result.host != driver_host or not path.exists()):
            write_atomically(path, result.log_text)
    except OSError as exc:
        return disk_failure(path, exc)
    return write_result(trial_dir, params, result)


def write_result(trial_dir: Path, params: dict, result) -> Failure | None:
    """Write `result.json` for a trial; a Failure (infra, disk) if the disk refuses it."""
    body = {"trial": result.number, "params": params, "host": result.host, "port": result.port,
            "failure": asdict(result.failure) if result.failure else None, "metrics": dict(result.metrics),
            "phases_s": dict(result.phases), "server": dict(result.server), "early_stop": dict(result.early_stop),
            "rate_search": list(result.probes), "startup": dict(result.startup), "replay_cpu": dict(result.replay_cpu)}
    try:
        write_atomically(trial_dir / "result.json", json.dumps(_finite(body), indent=1, sort_keys=True))
    except OSError as exc:
        return disk_failure(trial_dir / "result.json", exc)
    return None


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def disk_failure(path: Path, exc: OSError) -> Failure:
    return Failure("infra", f"{DISK_EVIDENCE} cannot write {path}: {exc.strerror or exc}",
                   "free space on the artifacts disk (artifacts_dir); the trial is queued again")


def is_disk_failure(failure: Failure | None) -> bool:
    return failure is not None and failure.kind == "infra" and failure.evidence.startswith(DISK_EVIDENCE)


def writable(directory: Path) -> str | None:
    """None if `directory` takes a small file now; otherwise why not (e.g. 'No space left on device')."""
    probe = directory / ".space-probe"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"\0" * PROBE_BYTES)
            f.flush()
            os.fsync(f.fileno())
        return None
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        try:
            probe.unlink()
        except OSError:
            pass
