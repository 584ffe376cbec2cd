"""How long a trial's replaying client stalls, with the vLLM server in the owner's session (as
trials start it) against a server in a session of its own (the reference, measured in the same run).

Each placement: a Ray task (the embedded local Ray, as a trial runs) boots one server of the
tiny model at max-num-seqs 1 and replays the same open-loop workload `--replays` times: 24
requests at 2 req/s, prompts ~350 tokens, outputs 100-300 (the shape of the live-traffic test's
observed window), more than one sequence at a time can serve, so the server stays saturated. A
heartbeat coroutine in the replay's event loop records its longest gap; the driver reads the
trial board every 0.5 s, as a study does, and records its slowest read. Linux's autogroup
scheduling (on here if /proc/sys/kernel/sched_autogroup_enabled is 1) is what tells the two apart.

    .venv/bin/python bench/client_stalls.py [--replays 3]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ray  # noqa: E402

from optimizer.driver.ray_runtime import ray_runtime  # noqa: E402
from optimizer.engine.tiny_model import write_tiny_model  # noqa: E402
from optimizer.engine.vllm import VllmServer  # noqa: E402
from optimizer.measure.replay import replay  # noqa: E402
from optimizer.testing.memory import memory_fraction  # noqa: E402
from optimizer.trial.channel import TrialBoard  # noqa: E402
from optimizer.workload import Request  # noqa: E402


class OwnSessionServer(VllmServer):
    """The reference: the guard (and so the server) in a session of its own."""

    PLACEMENT = {"start_new_session": True}


def workload(seed: int = 7) -> tuple[Request, ...]:
    rng, t, out = random.Random(seed), 0.0, []
    for i in range(24):
        out.append(Request(f"req-{i}", tuple(rng.randrange(100, 3000) for _ in range(rng.randint(300, 400))),
                           rng.randint(100, 300), t))
        t += rng.expovariate(2.0)
    return tuple(out)


def replay_with_heartbeat(base_url: str, model: str, requests) -> dict:
    gaps = []

    def beat(_t0):
        async def run():
            last = time.perf_counter()
            while True:
                await asyncio.sleep(0.05)
                now = time.perf_counter()
                gaps.append(now - last - 0.05)
                last = now
        return run()

    result = asyncio.run(replay(base_url, model, requests, None, during=beat))
    lag = sorted(max(0.0, r.sent_s - r.intended_s) for r in result.records)
    return {"window_s": result.window_s, "loop_gap_max_s": max(gaps, default=0.0),
            "lag_p50_ms": lag[len(lag) // 2] * 1000, "lag_max_ms": lag[-1] * 1000}


@ray.remote(max_retries=0)
def trial(own_session: bool, model: str, log: str, replays: int) -> list[dict]:
    cls = OwnSessionServer if own_session else VllmServer
    args = ["--load-format", "dummy", "--dtype", "bfloat16", "--max-num-seqs", "1", "--max-model-len", "4096",
            "--gpu-memory-utilization", str(memory_fraction(0.5)), "--enforce-eager"]
    with cls(model, args, Path(log), startup_timeout=300) as server:
        if server.state != "ready":
            raise RuntimeError(f"the server did not start: see {log}")
        return [replay_with_heartbeat(server.base_url, model, workload()) for _ in range(replays)]


def measure(own_session: bool, model: str, root: Path, replays: int) -> tuple[list[dict], float]:
    board = TrialBoard.remote()
    ref = trial.remote(own_session, model, str(root / f"server-{int(own_session)}.log"), replays)
    slowest = 0.0
    while not ray.wait([ref], timeout=0.5)[0]:
        t = time.monotonic()
        try:
            ray.get(board.get.remote(), timeout=30)
        except ray.exceptions.GetTimeoutError:
            pass
        slowest = max(slowest, time.monotonic() - t)
    return ray.get(ref), slowest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replays", type=int, default=3)
    a = ap.parse_args()
    autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled")
    print(f"autogroup scheduling: {autogroup.read_text().strip() if autogroup.exists() else 'absent'}")
    with tempfile.TemporaryDirectory() as tmp, ray_runtime(None):
        root = Path(tmp)
        model = str(write_tiny_model(root / "tiny"))
        worst = {}
        for own_session, name in ((True, "own session (reference)"), (False, "owner's session (trials)")):
            runs, board_s = measure(own_session, model, root, a.replays)
            for i, r in enumerate(runs):
                print(f"{name:26s} replay {i}: window {r['window_s']:5.1f} s, longest loop gap "
                      f"{r['loop_gap_max_s']:6.2f} s, send lag p50 {r['lag_p50_ms']:7.1f} ms max {r['lag_max_ms']:8.1f} ms")
            worst[own_session] = max(r["loop_gap_max_s"] for r in runs)
            print(f"{name:26s} driver's slowest board read {board_s:.2f} s; longest loop gap {worst[own_session]:.2f} s")
        print(f"longest loop gap, owner's session / own session: {worst[False] / max(worst[True], 1e-3):.3f}")


if __name__ == "__main__":
    main()
