"""Files a user or a deployment reads (best.yaml, k8s.yaml, the report, a published `vllm serve
--config`) are replaced whole or not at all: written to a temporary file in the same directory,
flushed to disk, then renamed over the old one. A full disk leaves the old file as it was, never a
truncated one; the temporary file is removed and the OSError raised."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | Path, text: str) -> Path:
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
