"""The moves of the `sensitivity` command: each knob of the recommended configuration moved one step
(search/screening.py's `moved`, the screening phase's step), or to the value `--to` names."""

from __future__ import annotations

from optimizer.config.space import SearchSpace, active
from optimizer.errors import ConfigError
from optimizer.search.screening import moved


def moves(params: dict, space: SearchSpace, knobs: list[str] | None = None, to: dict | None = None) -> list[tuple]:
    """[(knob, from, to)] for each knob of the space (or of `knobs`) active in `params`."""
    to = to or {}
    dims = {d.knob.name: d for d in space.dims}
    wanted = knobs or [n for n in dims if active(n, params)]
    out = []
    for name in wanted:
        if name not in dims:
            raise ConfigError(f"sensitivity: '{name}' is not a knob of this study's space ({', '.join(dims)}); "
                              "pass one of those")
        current = params.get(name)
        if current is None:
            continue
        new = to.get(name, moved(current, dims[name]))
        if new is not None and new != current:
            out.append((name, current, new))
    for name in to:
        if name not in wanted:
            raise ConfigError(f"sensitivity: --to {name}=... names a knob not being moved; add it to --knobs")
    return out
