"""Reading and writing one attribute of a study or a trial: the only place `user_attrs` is touched.

A holder is an Optuna study, trial or FrozenTrial, or a plain mapping of a study's attributes (what
`get_all_study_summaries` gives without loading the study).
"""

from __future__ import annotations

from collections.abc import Mapping


def attrs(holder) -> Mapping:
    """The holder's stored attributes (read-only use)."""
    return holder if isinstance(holder, Mapping) else holder.user_attrs


def get(holder, key: str, default=None):
    return attrs(holder).get(key, default)


def has(holder, key: str) -> bool:
    return key in attrs(holder)


def put(holder, key: str, value) -> None:
    """Store `value` (JSON) under `key` on a live study or trial."""
    holder.set_user_attr(key, value)


def put_stored(study, frozen, key: str, value) -> None:
    """Store `value` under `key` on a trial known only as a stored FrozenTrial (one a dead driver left)."""
    study._storage.set_trial_user_attr(frozen._trial_id, key, value)  # noqa: SLF001 - Optuna has no public call
