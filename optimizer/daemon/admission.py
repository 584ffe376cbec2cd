"""What the daemon's next generation does about the lengths production admits (its servers'
--max-model-len, `Observer.admits`), so that the generation runs instead of being refused:

- the observed workload's lengths are cut to what production admits (workload/observed.py), so a
  baseline whose max-model-len is below it would refuse the workload: it is raised to what
  production admits, and the note says so;
- a space whose max-model-len range (or choices) stops below what production admits is widened
  to reach it;
- when the window's rejections look like prompts past production's --max-model-len
  (`rejected_past`), the space's max-model-len is widened to WIDEN x what production admits (at
  most the model's limit), so the study measures what admitting longer requests costs. Whether a
  trial's KV cache holds one request of its max-model-len is checked before it boots
  (driver/kv_precheck.py), as for every trial.
A `--max-model-len` in `engine.extra_args` fixes it for every trial: nothing is changed, and the
note says so.
The notes go to the console and onto the generation's study (`admission`).
"""

from __future__ import annotations

from optimizer.config.flags import named_flags
from optimizer.config.schema import KnobRange, StudyConfig

WIDEN = 2
KNOB = "max-model-len"


def admitting(cfg: StudyConfig, admits: int | None, reach: int | None = None) -> tuple[StudyConfig, list[str]]:
    """`cfg` with its baseline and space able to admit `admits` tokens a request, and its space
    reaching `reach` (the widened length, when rejections call for it); the notes of what changed."""
    if not admits:
        return cfg, []
    pinned = _pinned(cfg.engine.extra_args)
    if pinned is not None:  # the operator fixed it for every trial: the knob would not move it
        return cfg, ([f"engine.extra_args fixes --max-model-len at {pinned}: not widened to admit longer requests; "
                      "move it to baseline to let the daemon widen it"] if reach or _below(pinned, admits) else [])
    notes = []
    baseline = dict(cfg.baseline or {})
    if KNOB in baseline and int(baseline[KNOB]) < admits:
        notes.append(f"baseline max-model-len raised from {int(baseline[KNOB]):,} to {admits:,}: production admits "
                     f"{admits:,} tokens a request and the observed lengths reach it")
        baseline[KNOB] = admits
    space, note = _space(cfg.space, admits, max(admits, reach or 0), reach is not None)
    notes += [note] if note else []
    return cfg.model_copy(update={"baseline": baseline or cfg.baseline, "space": space}), notes


def _space(space: dict, admits: int, target: int, rejected: bool) -> tuple[dict, str | None]:
    """The space with max-model-len reaching `target`. A space that does not name the knob searches
    the default knobs (max-model-len among them, up to the model's limit) when empty; a written
    space without it gets it only for rejections."""
    spec = space.get(KNOB)
    why = "production rejected requests that look longer than it admits" if rejected else "production admits it"
    if spec is None:
        if not space or not rejected or target <= admits:
            return space, None
        return ({**space, KNOB: KnobRange(low=admits, high=target)},
                f"space.max-model-len added, {admits:,} to {target:,}: {why}")
    if spec.choices is not None:
        if max(int(c) for c in spec.choices) >= target:
            return space, None
        return ({**space, KNOB: KnobRange(choices=[*spec.choices, target])},
                f"space.max-model-len choices widened with {target:,}: {why}")
    if spec.high is None or spec.high >= target:
        return space, None
    return ({**space, KNOB: spec.model_copy(update={"high": float(target)})},
            f"space.max-model-len high widened from {int(spec.high):,} to {target:,}: {why}")


def _pinned(args: list[str]) -> str | None:
    """The value `--max-model-len` takes in the trials' extra flags (the last one given), if any."""
    value = named_flags([str(a) for a in args]).get(KNOB)
    return value if isinstance(value, str) else None


def _below(value: str, admits: int) -> bool:
    try:
        return int(value) < admits
    except ValueError:  # vLLM's own forms (32k): its parser checks them
        return False


def widened(admits: int, model_limit: int) -> int:
    """The max-model-len the space reaches after rejections past `admits`: WIDEN x, at most the model's."""
    return min(WIDEN * admits, model_limit)
