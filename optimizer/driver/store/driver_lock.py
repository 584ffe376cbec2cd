"""The run-state file next to the study database: one driver at a time, and what a dead one left.

    trials.db.lock             flock held by the live driver (the kernel drops it when the driver dies)
    trials.db.runstate.json    the driver (pid, host, start), its embedded Ray's processes, and the
                               process group of every vLLM server it has running, rewritten atomically

A driver that starts takes the lock; a second driver on the same storage is refused in one
line. If the previous driver died (SIGKILL, OOM killer, power), its file is still there and
names what it left running: the vLLM process groups are killed (after checking that the group
leader is one of ours, so a reused process id is never touched), and so are the Ray processes
that outlive a killed driver (measured: its dashboard and runtime-env agents stay up).

This is the second line of defence: each server's guard (engine/lifeline.py) stops it when
the Ray worker that started it dies, on every node, and the recovery then finds nothing to
reap and says so. The file only covers the window after the driver heard of a server. Every server also carries
this storage's tag in its environment (`VLLM_OPTIMIZER_STORAGE`), so a server started in the
last half second before a crash is found by scanning this host's processes. Other nodes of a
cluster are not scanned (docs/troubleshooting.md#known-limits). Storage other than SQLite keeps the files in
the artifacts directory, named after the URL's digest.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from optimizer.driver.store.database import close_storages, masked, sqlite_path
from optimizer.driver.store.study_lock import StudyLock
from optimizer.engine.vllm import group_pids, terminate_group
from optimizer.errors import ConfigError, StorageError

STORAGE_TAG = "VLLM_OPTIMIZER_STORAGE"  # env var every trial server carries: this storage's digest
RUN_TAG = "VLLM_OPTIMIZER_RUN"  # and the run (driver) that started it
ORPHAN_STOP_S = 2.0  # SIGTERM -> SIGKILL for a dead run's server: no client waits on it


def storage_digest(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:16]


def paths_for(url: str, artifacts_dir: str | Path) -> tuple[Path, Path]:
    """(lock file, run-state file) for a storage URL."""
    db = sqlite_path(url)
    if db is not None:
        return db.with_name(db.name + ".lock"), db.with_name(db.name + ".runstate.json")
    base = Path(artifacts_dir).expanduser().resolve() / f"storage-{storage_digest(url)}"
    return base.with_name(base.name + ".lock"), base.with_name(base.name + ".runstate.json")


@dataclass
class Recovery:
    """What starting found of a previous run that did not end cleanly."""

    previous: dict | None = None  # the dead driver's record
    servers_killed: list[int] = field(default_factory=list)  # process groups
    ray_killed: int = 0
    notes: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.previous or self.servers_killed or self.ray_killed or self.notes)


def _process_key(p: psutil.Process) -> dict:
    return {"pid": p.pid, "create_time": p.create_time()}


def _same_process(rec: dict) -> psutil.Process | None:
    """The live process a record names, or None if it is gone or its pid was reused."""
    try:
        p = psutil.Process(int(rec["pid"]))
        if abs(p.create_time() - float(rec["create_time"])) < 0.01 and p.status() != psutil.STATUS_ZOMBIE:
            return p
    except (psutil.Error, KeyError, TypeError, ValueError):
        pass
    return None


def _env_of(pid: int) -> dict:
    try:
        return psutil.Process(pid).environ()
    except (psutil.Error, OSError):
        return {}


def _run_alive(run_id: str | None) -> bool:
    """True if the driver a server's RUN_TAG names still runs on this host (never kill its servers)."""
    try:
        host, pid, _ = (run_id or "").split(":")
        return host == socket.gethostname() and psutil.pid_exists(int(pid)) and int(pid) != os.getpid()
    except ValueError:
        return False


def tagged_groups(digest: str) -> set[int]:
    """Process groups on this host led by a trial server of this storage whose driver is gone
    (never a live driver's: e.g. one started from another artifacts directory on a database
    server, which this lock does not see)."""
    return _groups_where(lambda env: env.get(STORAGE_TAG) == digest and not _run_alive(env.get(RUN_TAG)))


def _groups_where(wanted) -> set[int]:
    """The process groups of this host's processes whose environment `wanted` accepts."""
    groups = set()
    for p in psutil.process_iter(["pid"]):
        if not wanted(_env_of(p.info["pid"])):
            continue
        try:
            groups.add(os.getpgid(p.info["pid"]))
        except ProcessLookupError:
            continue
    return groups


class RunState:
    """The lock and the run-state file of one storage, held by the driver for its whole run."""

    def __init__(self, storage_url: str, artifacts_dir: str | Path, study: str | None = None):
        self.url = storage_url
        self.study_lock = StudyLock(storage_url, study)  # on PostgreSQL: the study's own lock, every host sees it
        self.digest = storage_digest(storage_url)
        self.lock_path, self.path = paths_for(storage_url, artifacts_dir)
        self.run_id = f"{socket.gethostname()}:{os.getpid()}:{time.time():.3f}"
        self._lock_fd: int | None = None
        self._record: dict = {}
        self.previous: dict | None = None  # the dead driver's record, once acquired
        self.unwritten: str | None = None  # why the last write failed (a full disk), if it did

    # --- taking over ---------------------------------------------------------------------------
    def acquire(self) -> Recovery:
        """Take the lock (ConfigError if a live driver holds it; StorageError if the lock file cannot be
        made, e.g. in a directory that takes no files), then clean up after a dead one."""
        try:
            self.lock_path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # a directory that takes no files (/proc, a read-only mount), or a file in the path
            raise StorageError(f"storage {masked(self.url)}: cannot create its lock file {self.lock_path} "
                               f"({exc.strerror or exc}); {self._elsewhere()}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if not isinstance(exc, BlockingIOError):  # e.g. a file system without locks (ENOLCK)
                raise StorageError(f"storage {masked(self.url)}: cannot lock its lock file {self.lock_path} "
                                   f"({exc.strerror or exc}); {self._elsewhere()}") from None
            holder = self._read() or {}
            d = holder.get("driver", {})
            who = f"pid {d.get('pid')} on {d.get('host')}" if d else "another process"
            raise ConfigError(f"storage {masked(self.url)} is in use by another driver ({who}); stop it first, "
                              "or pass --storage with another database") from None
        try:
            self.study_lock.acquire()  # before any recovery: never fail another live driver's trials
        except BaseException:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            raise
        self._lock_fd = fd
        recovery = self._clean_up(self._read())
        self.previous = recovery.previous
        me = psutil.Process()
        self._record = {"driver": {"pid": me.pid, "create_time": me.create_time(), "host": socket.gethostname(),
                                   "run_id": self.run_id, "started_at": time.time()},
                        "ray_processes": [], "servers": {}}
        self._write(strict=True)
        return recovery

    def _clean_up(self, old: dict | None) -> Recovery:
        rec = Recovery(previous=(old or {}).get("driver"))
        if old is None and self.path.exists():
            rec.notes.append(f"run-state {self.path} was unreadable; scanned this host's processes instead")
        here = socket.gethostname()
        groups: set[int] = set()
        stopped = []  # recorded, and already gone: their guards stopped them (engine/lifeline.py)
        for key, s in ((old or {}).get("servers") or {}).items():
            if s.get("host") != here:
                rec.notes.append(f"server of {key} on {s.get('host')} (pgid {s.get('pgid')}) is on another host: "
                                 "not reaped from here (its guard stops it when its Ray worker dies)")
                continue
            pgid = int(s["pgid"])
            if group_pids(pgid) and _env_of(pgid).get(STORAGE_TAG) == self.digest:
                groups.add(pgid)
            elif not group_pids(pgid):
                stopped.append(key)
        groups |= tagged_groups(self.digest)  # what the file had not heard of yet
        if stopped:
            rec.notes.append(f"the vLLM server(s) of {', '.join(sorted(stopped))} had already stopped with their "
                             "Ray workers: nothing left to reap")
        for pgid in sorted(groups):
            terminate_group(pgid, timeout=ORPHAN_STOP_S)
            rec.servers_killed.append(pgid)
        if (old or {}).get("driver", {}).get("host") == here:
            for proc_rec in old.get("ray_processes") or []:
                p = _same_process(proc_rec)
                if p is not None:
                    try:
                        p.kill()
                        rec.ray_killed += 1
                    except psutil.Error:
                        pass
        return rec

    # --- while running ---------------------------------------------------------------------------
    def server_env(self) -> dict[str, str]:
        """The tags every trial server gets in its environment."""
        return {STORAGE_TAG: self.digest, RUN_TAG: self.run_id}

    def record_ray(self) -> None:
        """Remember the embedded Ray's processes (this driver's descendants right after ray.init)."""
        try:
            kids = psutil.Process().children(recursive=True)
        except psutil.Error:
            return
        self._record["ray_processes"] = [_process_key(p) for p in kids if _alive(p)]
        self._write()

    def add_server(self, key: str, host: str, pgid: int, study: str, trial: int) -> None:
        self._record.setdefault("servers", {})[key] = {"host": host, "pgid": pgid, "study": study, "trial": trial}
        self._write()

    def remove_server(self, key: str) -> None:
        if self._record.get("servers", {}).pop(key, None) is not None:
            self._write()

    def servers(self) -> dict:
        return dict(self._record.get("servers", {}))

    def run_groups(self) -> set[int]:
        """The process groups of this run's trial servers on this host, found by their tag (no Ray:
        also one the board had not told of yet, or one whose board does not answer)."""
        return _groups_where(lambda env: env.get(RUN_TAG) == self.run_id)

    def reap(self, key: str, timeout: float = 5.0) -> None:
        """Kill the recorded server's process group if it runs on this host (the board is gone)."""
        where = self.servers().get(key)
        if where and where["host"] == socket.gethostname():
            terminate_group(where["pgid"], timeout)

    def relock(self) -> None:
        """Take the study's database lock again after the storage was lost (PostgreSQL drops a
        session's locks with it); ConfigError when another driver took it meanwhile."""
        self.study_lock.release()
        self.study_lock.acquire()

    def _elsewhere(self) -> str:
        """The fix for a lock file that cannot be made: SQLite keeps it beside the database,
        other storage in the artifacts directory."""
        if sqlite_path(self.url) is not None:
            return "pass --storage with a writable directory"
        return "pass --artifacts-dir with a writable directory"

    def release(self) -> None:
        """A clean exit (or a refused start): this process's connections to the storage close
        (a WAL database then loses its -wal and -shm), then the file goes, then the lock."""
        if self._lock_fd is None:
            return
        try:
            close_storages(self.url)
            self.path.unlink(missing_ok=True)
        finally:
            self.study_lock.release()
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> "RunState":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    # --- the file ------------------------------------------------------------------------------
    def _read(self) -> dict | None:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _write(self, strict: bool = False) -> None:
        """Atomically: a crash leaves the old file or the new one, never half of one. A full disk
        keeps the record in memory (the next write retries; the servers' environment tags cover
        the gap) unless `strict` (taking over: then the driver must not start)."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            with open(tmp, "w") as f:
                json.dump(self._record, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if strict:
                raise StorageError(f"run-state {self.path}: cannot write it ({exc.strerror or exc}); "
                                   "free space next to the study database") from exc
            self.unwritten = f"{exc.strerror or exc}"
            return
        self.unwritten = None


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
