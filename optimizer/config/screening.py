"""The screening moves: each knob of the space moved one step from the baseline, alone, the
operator's one-variable-at-a-time method (the search's first phase, driver/launch.py).

A numeric knob doubles (a log range) or moves by a quarter of its range, upward unless that
leaves the range; a categorical knob takes the next choice; a switch flips. The value is
rounded as an operator writes it (config/round_values.py). A knob the baseline leaves to vLLM
has no value to move from: it is not screened (the sampler searches it).
"""

from __future__ import annotations

from optimizer.config.round_values import round_draw


def moved(value, dim) -> object | None:
    """The knob's value one step away from `value` within its dimension (None: nowhere to go)."""
    if dim.choices is not None:
        choices = list(dim.choices)
        if len(choices) < 2:
            return None
        i = choices.index(value) if value in choices else -1
        return choices[(i + 1) % len(choices)]
    low, high = dim.low, dim.high
    if dim.knob.kind == "bool":
        return not value
    if dim.log:
        up, down = value * 2, value / 2
    else:
        step = (high - low) / 4
        up, down = value + step, value - step
    new = up if up <= high else down
    if new < low:
        return None
    return int(round(new)) if dim.knob.kind == "int" else round(new, 2)


def screening_moves(baseline: dict, space) -> list[tuple[str, object]]:
    """[(knob, moved value)], one per knob of `space` the baseline sets, in the space's order."""
    out = []
    for d in space.dims:
        name = d.knob.name
        if baseline.get(name) is None:
            continue
        new = moved(baseline[name], d)
        if new is not None and d.choices is None:
            new = round_draw(name, new, d.low, d.high, space.block, d.ladder)
        if new is not None and new != baseline[name]:
            out.append((name, new))
    return out
