"""The runs made after the search, stored on the study: the confirmation (the top configurations
and the baseline measured again), the minimal change (each knob the winner changed put back and
measured), the one-knob sensitivity of the best, and the scaling of replicas behind a proxy.

Readers get frozen records (`Confirmation`, `MinimalChange`), read by trial number, so no reader
indexes the stored dictionaries by convention; the driver, which extends a record run by run, gets
it as stored (`*_as_stored`) and writes it back whole.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from optimizer.record._holder import get, put

CONFIRMATION, MINIMAL, SENSITIVITY, SCALING = "confirmation", "minimal", "sensitivity", "scaling"


# ---- the confirmation ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Runs:
    """One configuration's runs in a confirmation: the values measured (its search run first), the
    runs that failed, and the leader it was settled against (not booted again), if it was."""
    values: tuple[float, ...] = ()
    failed: int = 0
    settled: int | None = None


def _by_number(stored: Mapping | None) -> Mapping[int, Mapping]:
    return MappingProxyType({int(n): MappingProxyType(dict(v)) for n, v in (stored or {}).items()})


@dataclass(frozen=True)
class Confirmation:
    """A confirmation as read: its runs by trial number, the candidates it re-measured, and its verdict
    (verdict/confirmed.py decide: each candidate's 95% range of its geometric mean, each other's ratio to
    the winner, the pooled noise). `current` is False when new trials have changed the study's top since
    (verdict/confirmed.py read): a stale confirmation names no winner."""
    runs: Mapping[int, Runs] = field(default_factory=lambda: MappingProxyType({}))
    candidates: tuple[int, ...] | None = None
    top: int | None = None
    repeats: int | None = None
    baseline: int | None = None
    winner: int | None = None
    clear: bool = False
    alone: bool = False
    intervals: Mapping[int, Mapping] = field(default_factory=lambda: MappingProxyType({}))
    ratios: Mapping[int, Mapping] = field(default_factory=lambda: MappingProxyType({}))
    noise: Mapping | None = None
    disqualified: tuple[int, ...] = ()
    simpler: Mapping | None = None  # the winner is not the best mean but, within its noise, changes fewer knobs
    judged: bool = False  # its verdict was stored with the one statistic (it has a `noise` entry)
    current: bool = True

    @classmethod
    def of(cls, stored: Mapping | None, current: bool = True) -> "Confirmation":
        d = stored or {}
        runs = {int(n): Runs(tuple(e.get("values") or ()), int(e.get("failed") or 0),
                             int(e["settled"]) if e.get("settled") not in (None, "") else None)
                for n, e in (d.get("runs") or {}).items()}
        return cls(MappingProxyType(runs),
                   tuple(int(n) for n in d["candidates"]) if d.get("candidates") is not None else None,
                   d.get("top"), d.get("repeats"), d.get("baseline"), d.get("winner"), bool(d.get("clear")),
                   bool(d.get("alone")), _by_number(d.get("intervals")), _by_number(d.get("ratios")),
                   MappingProxyType(dict(d["noise"])) if d.get("noise") else None,
                   tuple(d.get("disqualified") or ()),
                   MappingProxyType(dict(d["simpler"])) if d.get("simpler") else None, "noise" in d, current)

    @property
    def current_winner(self) -> int | None:
        """The winner, when the confirmation still describes the study's top configurations."""
        return self.winner if self.current else None

    def values(self, number: int) -> list[float]:
        """The values measured for trial `number` (its own run first; [] when none)."""
        return list(self.runs[number].values) if number in self.runs else []

    def interval(self, number: int) -> Mapping | None:
        """The 95% range of trial `number`'s geometric mean ({"mean", "low", "high", "n"}), if it has one."""
        return self.intervals.get(number)

    def every_values(self, but: int | None = None) -> list[list[float]]:
        """Each re-measured configuration's values (but trial `but`'s), for the pooled noise."""
        return [list(r.values) for n, r in self.runs.items() if n != but]


def read_confirmation(holder) -> Confirmation:
    """The stored confirmation, frozen (an empty one when there is none)."""
    return Confirmation.of(get(holder, CONFIRMATION))


def confirmation_as_stored(holder) -> dict:
    """The stored confirmation as its writer keeps it (a copy; {} when there is none):
    {"runs": {trial number as text: {"values", "failed", "settled"?}}, "repeats", "top", "candidates",
    "baseline", and its verdict}. For the driver that extends it and for a verdict read again."""
    return copy.deepcopy(dict(get(holder, CONFIRMATION) or {}))


def write_confirmation(study, record: dict) -> None:
    put(study, CONFIRMATION, record)


# ---- the minimal change --------------------------------------------------------------------------
@dataclass(frozen=True)
class MinimalChange:
    """The minimal-change step as read (driver/minimal.py writes it): the winner it started from, the
    confirmation it answered (its candidates and repeats), one row per knob put back (as stored:
    measure/reversion.py's rows with the runs each rests on), the combined check, and the final
    configuration with its values; `runs` are the step's own runs by configuration."""
    done: bool = False
    winner: int | None = None
    candidates: tuple[int, ...] | None = None
    repeats: int | None = None
    rows: tuple[Mapping, ...] = ()
    combined: Mapping | None = None
    final: Mapping | None = None
    boots: int | None = None
    wall_s: float | None = None
    runs: Mapping[str, tuple] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(cls, stored: Mapping | None) -> "MinimalChange":
        d = copy.deepcopy(dict(stored or {}))
        return cls(bool(d.get("done")), d.get("winner"),
                   tuple(int(n) for n in d["candidates"]) if d.get("candidates") is not None else None,
                   d.get("repeats"), tuple(MappingProxyType(r) for r in d.get("rows") or ()),
                   MappingProxyType(d["combined"]) if d.get("combined") else None,
                   MappingProxyType(d["final"]) if d.get("final") else None, d.get("boots"), d.get("wall_s"),
                   MappingProxyType({k: tuple(v) for k, v in (d.get("runs") or {}).items()}))

    def answers(self, conf: Confirmation) -> bool:
        """Finished for this confirmation's winner, candidates and repeats (a confirmation done again,
        or a stale one, makes it stale)."""
        return (self.done and conf.current_winner is not None and self.winner == conf.current_winner
                and self.candidates == conf.candidates and self.repeats == conf.repeats)


def read_minimal(holder) -> MinimalChange:
    """The stored minimal-change record, frozen (an empty one when there is none)."""
    return MinimalChange.of(get(holder, MINIMAL))


def minimal_as_stored(holder) -> dict:
    """The stored minimal-change record as its writer keeps it (a copy; {} when there is none), for a
    step that resumes."""
    return copy.deepcopy(dict(get(holder, MINIMAL) or {}))


def write_minimal(study, record: dict) -> None:
    put(study, MINIMAL, record)


# ---- sensitivity and scaling ---------------------------------------------------------------------
def sensitivity(holder) -> list | None:
    """The sensitivity rows: one per knob moved, each with the trial it moved from."""
    return get(holder, SENSITIVITY)


def write_sensitivity(study, rows: list) -> None:
    put(study, SENSITIVITY, rows)


def scaling(holder) -> dict:
    """Trial number as text -> the scaling measured on its flags ({} when none was)."""
    return get(holder, SCALING) or {}


def write_scaling(study, by_trial: dict) -> None:
    put(study, SCALING, by_trial)
