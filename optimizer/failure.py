"""What went wrong with a trial, in three words an operator reads: its kind, the evidence (the log
line or the measurement that shows it) and the remedy. engine/failures.py classifies a server's
log into one; measure/validity.py names a replay that cannot be trusted with one. Imports nothing
of the project.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Failure:
    kind: str
    evidence: str  # the log line that shows it (empty when there is none)
    remedy: str  # one line, in operator words
    fits_max_model_len: int | None = None  # vLLM's own estimate, when it states one
