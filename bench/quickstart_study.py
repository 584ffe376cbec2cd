"""A one-trial study of the quickstart's baseline flags, for benches that calibrate the twin on a real
run and then boot the same flags themselves (bench/knee.py, bench/dp_twin.py): the tiny model with
1 GiB of KV, the quickstart's workload, eager (a shorter boot; the twin is calibrated on and
compared with the same server), no early stop, no confirmation.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def one_trial_study(root: Path, name: str, env: dict | None = None) -> Path:
    """Run the study under `root` (its server's environment `env`) and return its config's path."""
    from optimizer.engine.tiny_model import write_tiny_model
    from optimizer.testing.memory import memory_fraction

    quick = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    engine = {"extra_args": ["--enforce-eager"], **({"env": env} if env else {})}
    cfg = {"study_name": name, "storage": f"sqlite:///{root / 'trials.db'}", "artifacts_dir": str(root / "artifacts"),
           "n_trials": 1, "model": {"path": str(write_tiny_model(root / "tiny")), "load_format": "dummy",
                                    "dtype": "bfloat16"},
           "baseline": {**quick["baseline"], "gpu-memory-utilization": memory_fraction(1.0)},
           "space": quick["space"], "workload": quick["workload"], "objective": {"name": "throughput"},
           "early_stop": {"enabled": False}, "confirm": {"top": 0, "minimal": False}, "engine": engine}
    path = root / "study.yaml"
    path.write_text(yaml.safe_dump(cfg))
    subprocess.run([sys.executable, "-m", "optimizer", "run", "--config", str(path)], check=True, cwd=root,
                   stdout=subprocess.DEVNULL)
    return path
