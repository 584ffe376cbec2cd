"""The quickstart as a Ray job: `ray job submit` -> SUCCEEDED, on a real `ray start --head` here.

Starts a head on free ports with its own temp dir (token auth on, as Ray 2.60 does), submits
`python -m optimizer run --config CONFIG --ray-address auto` with this repository as
`--working-dir` (Ray uploads it minus what .gitignore lists) and an absolute storage and
artifacts dir, waits for the job (blocking `ray job submit`), prints the round trip, the job's
status and the study's outcome, then stops the head's own processes.

    .venv/bin/python bench/job_round_trip.py [--config examples/quickstart.yaml]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

import optuna
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optimizer.testing import ray_head as rayhead  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="examples/quickstart.yaml")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="jobrt-", dir="/tmp"))
    head = rayhead.start(str(work / "ray"))
    storage = f"sqlite:///{work / 'trials.db'}"
    study_name = yaml.safe_load((ROOT / args.config).read_text()).get("study_name", "vllm-tuning")
    try:
        entry = [sys.executable, "-m", "optimizer", "run", "--config", args.config, "--ray-address", "auto",
                 "--storage", storage, "--artifacts-dir", str(work / "artifacts")]
        t0 = time.monotonic()
        job = rayhead.submit(head, ["--working-dir", str(ROOT), "--", *entry], timeout=120)
        round_trip = time.monotonic() - t0
        ended = re.search(r"Job '(\S+)' (succeeded|failed|stopped)", job.stdout + job.stderr)
        print(f"ray job submit -> {ended.group(2).upper() if ended else 'unknown: ' + job.stderr[-500:]}: "
              f"{round_trip:.0f} s round trip ({round_trip / 60:.1f} min)")
        tail = [line for line in job.stdout.splitlines() if line.startswith(("Best:", "Gain", "  re-measured", "Saved"))]
        print("\n".join(tail))
        study = optuna.load_study(study_name=study_name, storage=storage)
        counts = {}
        for t in study.trials:
            counts[t.state.name] = counts.get(t.state.name, 0) + 1
        print(f"study '{study_name}': {counts}")
    finally:
        left = rayhead.stop(head)
        print(f"head stopped; processes left: {len(left)}")


if __name__ == "__main__":
    main()
