"""Which version of this tool's study record a stored study holds, checked before anything is read or written.

A study the tool makes carries `vllm_optimizer_record` (RECORD_VERSION) among its user attributes,
stamped with the rest of what it measures (driver/plan.py). On opening:

- a study stamped by a newer version (a record this one cannot read) is refused in one line;
- a study of this tool from before the stamp (it has the tool's `workload_hash`, no version) is
  version 1, and `migrate` stamps it so once the run goes on (never by a command that only reads);
- a study the tool did not make (same name, made by another program or by hand: trials, or
  attributes none of which are the tool's, and no stamp) is refused, never adopted and stamped;
- a study with nothing in it yet (created, then stopped before its stamp) is the tool's to stamp.

driver/store/database.py `check_stored` runs `check` on a read-only look before the driver opens
the storage for writing.
"""

from __future__ import annotations

from optimizer.errors import ConfigError
from optimizer.record import of_study
from optimizer.record._holder import attrs, get, put

RECORD_KEY = "vllm_optimizer_record"
RECORD_VERSION = 1
# What the tool writes on a study before `workload_hash`, its last stamp key (driver/plan.py `_stamp`):
# a study stopped half-stamped holds only these.
STAMP_KEYS = frozenset({RECORD_KEY, *of_study.STAMP})


def check(study) -> None:
    """ConfigError when `study` was written by a newer version of this tool, or not by this tool."""
    version = get(study, RECORD_KEY)
    if isinstance(version, int) and version > RECORD_VERSION:
        raise ConfigError(f"study '{study.study_name}' was written by a newer vllm-optimizer (study record "
                          f"version {version}; this one reads up to {RECORD_VERSION}): upgrade vllm-optimizer, or "
                          "pass --study-name NEW")
    if version is not None or of_study.stamped(study):
        return
    foreign = sorted(set(attrs(study)) - STAMP_KEYS)
    trials = len(study.get_trials(deepcopy=False))
    if trials or foreign:
        held = f"{trials} trial(s)" if trials else f"attributes {', '.join(foreign[:3])}"
        raise ConfigError(f"study '{study.study_name}' was not made by vllm-optimizer (it holds {held} and no stamp "
                          "of this tool): pass --study-name NEW; the study is left as it is")


def stamp(study) -> None:
    """Stamp this version on a study being created (driver/plan.py, before its identity keys)."""
    put(study, RECORD_KEY, RECORD_VERSION)


def migrate(study) -> None:
    """Stamp the record version on a study of this tool made before the stamp existed (version 1)."""
    if get(study, RECORD_KEY) is None and of_study.stamped(study):
        stamp(study)
