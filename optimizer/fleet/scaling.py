"""Measured scaling: what N replicas behind a proxy carried against N times one replica alone.

`efficiency = fleet goodput / (replicas x one replica's goodput)`, both measured in the same run
on the same booted replicas (fleet/together.py): 1.0 is perfect scaling, below it the proxy, the
balancing or shared hardware cost something. Its interval is the project's one statistic: the
log of each run, with the noise pooled over the repeated runs of both sides (measure/noise.py),
so it never leaves (0, inf). With one run a side there is no noise to pool and no interval.

The records are stored on the study (user attribute `scaling`, one a trial: the winner's and the
baseline's may both be measured) and `plan` divides the per-replica
rate by it once a fleet has more than one replica (fleet/capacity.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.measure.noise import geomean, pooled, ratio
from optimizer.record import remeasured



@dataclass(frozen=True)
class Scaling:
    trial: int  # the study's trial whose flags the replicas ran
    replicas: int
    one: tuple[float, ...]  # one replica alone, goodput req/s per run
    fleet: tuple[float, ...]  # the replicas behind the proxy, goodput req/s per run
    proxy: str = "nginx"
    low: float | None = None  # the efficiency's 95% interval; None with one run a side
    high: float | None = None
    noise_sd: float | None = None
    noise_df: int = 0
    date: str = ""
    data_parallel: dict | None = None  # {"trial", "goodput"}: vLLM's own data parallel of the same size, if measured

    @property
    def efficiency(self) -> float:
        return geomean(self.fleet) / (self.replicas * geomean(self.one))

    def as_dict(self) -> dict:
        return {"trial": self.trial, "replicas": self.replicas, "one": list(self.one), "fleet": list(self.fleet),
                "proxy": self.proxy, "efficiency": self.efficiency, "low": self.low, "high": self.high,
                "noise_sd": self.noise_sd, "noise_df": self.noise_df, "date": self.date,
                "data_parallel": self.data_parallel}

    @classmethod
    def from_dict(cls, d: dict) -> "Scaling":
        return cls(int(d["trial"]), int(d["replicas"]), tuple(d["one"]), tuple(d["fleet"]), d.get("proxy", "nginx"),
                   d.get("low"), d.get("high"), d.get("noise_sd"), int(d.get("noise_df") or 0), d.get("date", ""),
                   d.get("data_parallel"))

    def describe(self) -> str:
        """'2 replicas behind nginx carried 0.93x (95% CI 0.81-1.07x) of 2 x one replica alone (...)'."""
        runs = f"{len(self.fleet)} run(s) a side"
        ci = (f" (95% CI {self.low:.2f}-{self.high:.2f}x, noise pooled over both sides: {self.noise_sd:.1%} a run, "
              f"{self.noise_df} df)" if self.low is not None else " (one run a side: no noise to pool, no interval)")
        return (f"{self.replicas} replicas of trial {self.trial} behind {self.proxy} carried {self.efficiency:.2f}x"
                f"{ci} of {self.replicas} x one replica alone: {geomean(self.fleet):.3g} against "
                f"{geomean(self.one):.3g} req/s at the SLOs; {runs}")


def scaling_of(one: list[float], fleet: list[float], replicas: int, trial: int, date: str = "",
               data_parallel: dict | None = None) -> Scaling:
    """The record for these runs (goodput req/s; a run that held the SLOs at no rate counts as
    nothing measured and is refused by the caller)."""
    noise = pooled([one, fleet])
    low = high = None
    if noise is not None and noise.sd > 0:
        r = ratio(fleet, [replicas * v for v in one], noise)
        low, high = r.low, r.high
    elif noise is not None:  # identical runs: the interval is the point
        low = high = geomean(fleet) / (replicas * geomean(one))
    return Scaling(trial, replicas, tuple(one), tuple(fleet), "nginx", low, high,
                   noise.sd if noise else None, noise.df if noise else 0, date, data_parallel)


def stored(study) -> dict[int, Scaling]:
    """Every scaling measured on the study, by the trial whose flags the replicas ran."""
    return {int(k): Scaling.from_dict(d) for k, d in remeasured.scaling(study).items()}


def with_record(study, record: Scaling) -> dict:
    """The study's `scaling` attribute with `record` put in (or over) its trial's place."""
    return {**remeasured.scaling(study), str(record.trial): record.as_dict()}


def for_trial(study, trial: int) -> Scaling | None:
    """The scaling measured on `trial`'s flags; None when none was (never borrowed from another)."""
    return stored(study).get(trial)
