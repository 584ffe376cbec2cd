"""How often the minimal-change step's run-by-run rule (measure/reversion.py) decides right, and as
three fixed runs would, against seeded noise: a winner measured three times (and two other
configurations, for the pooled noise), one knob put back with a known effect.

Printed per effect (the reverted configuration's value over the winner's, latency: > 1 is worse)
and noise level (the standard deviation of log(value) of one run): the share of seeds where the
knob was kept, the share where the run-by-run verdict equals the verdict of three fixed runs
(kept iff measurably worse), and the mean runs the run-by-run rule spent.

    .venv/bin/python bench/decision_rules.py [--seeds 1000]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from optimizer.measure.noise import pooled, ratio  # noqa: E402
from optimizer.measure.reversion import KEPT, REVERTED, minimal_change  # noqa: E402

WINNER, BASELINE = {"max-num-seqs": 36}, {"max-num-seqs": 16}


def one_knob(seed: int, effect: float, sd: float, max_runs: int = 3) -> tuple[str, str, int]:
    """(the run-by-run verdict, the three-fixed-runs verdict, runs spent) for one seed."""
    rng = random.Random(seed)
    winner = [300.0 * math.exp(rng.gauss(0, sd)) for _ in range(3)]
    groups = [winner] + [[v * math.exp(rng.gauss(0, sd)) for _ in range(3)] for v in (320.0, 2400.0)]
    draws = [300.0 * effect * math.exp(rng.gauss(0, sd)) for _ in range(max_runs)]
    row = minimal_change(WINNER, BASELINE, dict(BASELINE), winner, groups, lambda c, k: draws[k], False,
                         max_runs=max_runs).rows[0]
    full = KEPT if ratio(draws, winner, pooled(groups + [draws])).worse(False) else REVERTED
    return row.verdict, full, len(row.values)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=1000)
    ns = p.parse_args()
    print(f"{'noise':>6s} {'effect':>7s} {'kept':>6s} {'as 3 runs':>10s} {'runs':>5s}")
    for sd in (0.05, 0.10, 0.15):
        for effect in (1.0, 1.1, 1.2, 1.3, 1.5, 2.0, 3.0):
            rows = [one_knob(seed, effect, sd) for seed in range(ns.seeds)]
            kept = sum(v == KEPT for v, _, _ in rows) / ns.seeds
            same = sum(v == f for v, f, _ in rows) / ns.seeds
            runs = sum(n for _, _, n in rows) / ns.seeds
            print(f"{sd:6.0%} {effect:6.1f}x {kept:6.1%} {same:10.1%} {runs:5.2f}")


if __name__ == "__main__":
    main()
