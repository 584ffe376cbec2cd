"""A path the user gave where a directory is expected (artifacts_dir, --out, a model directory):
refused in one line when it, or a folder on its way, is a file, before anything is written."""

from __future__ import annotations

from pathlib import Path

from optimizer.errors import ConfigError


def directory_expected(path: str | Path, what: str, fix: str) -> None:
    """Raise ConfigError when `path` or its nearest existing ancestor is not a directory (a missing
    directory is fine: it is created when needed)."""
    given = Path(path).expanduser()
    for place in (given, *given.absolute().parents):
        try:
            there = place.exists()
        except OSError as exc:  # e.g. a folder on the way that this user may not read
            raise ConfigError(f"{what} {path}: {place} cannot be read ({exc.strerror}); {fix}") from exc
        if there:
            if place.is_dir():
                return
            kind = "a file" if place.is_file() else "not a directory"
            which = "it" if place == given else str(place)
            raise ConfigError(f"{what} {path}: {which} is {kind}; {fix}")
