"""The runs made after the search, stored on the study: the confirmation (the top configurations
and the baseline measured again), the minimal change (each knob the winner changed put back and
measured), the one-knob sensitivity of the best, and the scaling of replicas behind a proxy.

A confirmation is {"runs": {trial number as text: {"values", "failed", "settled"?}}, "repeats",
"top", "candidates", "baseline", and its verdict (verdict/confirmed.py decide)}; the accessors
below read its runs by trial number, so no reader indexes it by convention.
"""

from __future__ import annotations

from optimizer.record._holder import get, put

CONFIRMATION, MINIMAL, SENSITIVITY, SCALING = "confirmation", "minimal", "sensitivity", "scaling"


# ---- the confirmation ----------------------------------------------------------------------------
def confirmation(holder) -> dict:
    """The stored confirmation, as a copy ({} when there is none)."""
    return dict(get(holder, CONFIRMATION) or {})


def write_confirmation(study, record: dict) -> None:
    put(study, CONFIRMATION, record)


def runs(record: dict) -> dict:
    """A confirmation's (or a minimal change's) runs: trial number as text -> its entry."""
    return dict(record.get("runs") or {})


def entry(record: dict, number: int) -> dict:
    """Trial `number`'s runs in a confirmation: {"values", "failed", "settled"?} ({} when it has none)."""
    return (record.get("runs") or {}).get(str(number)) or {}


def values(record: dict, number: int) -> list[float]:
    """The values a confirmation measured for trial `number` (its own run first; [] when none)."""
    return list(entry(record, number).get("values") or [])


def interval(record: dict, number: int) -> dict | None:
    """The confirmation's 95% range of trial `number`'s geometric mean ({"mean", "low", "high", "n"}), if it has one."""
    return (record.get("intervals") or {}).get(str(number))


def every_values(record: dict, but: int | None = None) -> list[list[float]]:
    """Each re-measured configuration's values (but trial `but`'s), for the pooled noise."""
    return [e.get("values") or [] for n, e in (record.get("runs") or {}).items() if but is None or n != str(but)]


# ---- the minimal change --------------------------------------------------------------------------
def minimal(holder) -> dict:
    """The stored minimal-change record ({} when there is none)."""
    return get(holder, MINIMAL) or {}


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
