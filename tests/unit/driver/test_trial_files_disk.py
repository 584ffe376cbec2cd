"""A full artifacts disk, for real (a 1 MiB tmpfs filled to ENOSPC): the trial fails as `infra`
with "disk:" evidence, nothing half-written is left, no server is launched, and once space is
freed the probe and the result writer work again."""

import errno
import json
import math
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from optimizer.driver.store.driver_lock import RunState
from optimizer.driver.store.trial_files import is_disk_failure, writable, write_result
from optimizer.engine.failures import Failure
from optimizer.engine.vllm import DISK_EVIDENCE, LAUNCH_PREFIX, VllmServer
from optimizer.trial.spec import TrialResult


@pytest.fixture
def mounted(tmp_path):
    """A mounted 1 MiB tmpfs (unmounted afterwards)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True,
                              text=True)
    except FileNotFoundError:
        pytest.skip("cannot mount a tmpfs: no mount command")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {done.stderr.strip()}")
    try:
        (mnt / "artifacts" / "s" / "trial-0").mkdir(parents=True)  # made while there was room
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@pytest.fixture
def disk(mounted):
    """The tmpfs, full: a filler file takes all of it."""
    _fill(mounted)
    return mounted


def _fill(mnt: Path) -> None:
    fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


def _result(failure: Failure | None = None, **kw) -> TrialResult:
    return TrialResult(0, failure, {"output_throughput": 12.5, "ttft_ms_p99": math.inf, "send_rate_ratio": math.nan},
                       phases={"startup": 1.0}, host="node-1", port=8000, **kw)


def test_a_full_disk_is_reported_by_the_probe(disk):
    why = writable(disk / "artifacts")
    assert why is not None and "space" in why
    assert not (disk / "artifacts" / ".space-probe").exists()


def test_a_result_that_cannot_be_written_fails_the_trial_as_infra(disk):
    trial_dir = disk / "artifacts" / "s" / "trial-0"
    failure = write_result(trial_dir, {"max-num-seqs": 64}, _result())
    assert failure is not None and failure.kind == "infra"
    assert failure.evidence.startswith(DISK_EVIDENCE) and str(trial_dir / "result.json") in failure.evidence
    assert "space" in failure.evidence and "artifacts_dir" in failure.remedy
    assert is_disk_failure(failure)
    assert list(trial_dir.iterdir()) == []  # no result.json, no result.json.tmp


def test_a_new_trial_dir_on_a_full_disk_is_a_disk_failure_too(disk):
    failure = write_result(disk / "artifacts" / "s" / "trial-7", {}, _result())
    assert is_disk_failure(failure)
    assert not (disk / "artifacts" / "s" / "trial-7" / "result.json").exists()


def test_a_server_whose_log_cannot_be_written_is_never_launched(disk, tiny_model):
    log = disk / "artifacts" / "s" / "trial-0" / "server.log"
    server = VllmServer(str(tiny_model), ["--max-num-seqs", "4"], log)
    assert server.start() is False
    assert server.proc is None and server.state == "failed"
    assert server.failure.kind == "infra" and server.failure.evidence.startswith(DISK_EVIDENCE)
    assert str(log) in server.failure.evidence and is_disk_failure(server.failure)
    assert server.start() is False and server.proc is None  # once per server: nothing launched later either
    report = server.stop()
    assert report.leftover_pids == () and report.killed is False


def test_after_space_is_freed_the_probe_passes_and_results_are_valid_json(disk, tiny_model):
    (disk / "filler").unlink()
    assert writable(disk / "artifacts") is None
    trial_dir = disk / "artifacts" / "s" / "trial-0"
    failure = Failure("infra", "x", "y")
    assert write_result(trial_dir, {"max-num-seqs": 64}, _result(failure=failure, probes=({"rate": math.inf},))) is None
    body = json.loads((trial_dir / "result.json").read_text())  # strict JSON: no Infinity/NaN tokens
    assert body["metrics"] == {"output_throughput": 12.5, "ttft_ms_p99": None, "send_rate_ratio": None}
    assert body["rate_search"] == [{"rate": None}]
    assert body["failure"] == {"kind": "infra", "evidence": "x", "remedy": "y", "fits_max_model_len": None}
    assert (body["trial"], body["params"], body["host"], body["port"]) == (0, {"max-num-seqs": 64}, "node-1", 8000)
    assert [p.name for p in trial_dir.iterdir()] == ["result.json"]
    log = trial_dir / "server.log"  # and a server's log takes its launch line again
    server = VllmServer(str(tiny_model), [], log, startup_timeout=0.1, python="/bin/false")
    server.start()
    server.stop()
    assert log.read_text().startswith(LAUNCH_PREFIX) and not is_disk_failure(server.failure)


def test_a_full_disk_under_the_run_state_does_not_stop_the_driver(mounted):
    """Storage other than SQLite keeps the run-state in the artifacts dir: the disk a trial can fill."""
    rs = RunState("postgresql://u:p@h/db", mounted / "artifacts")
    rs.acquire()
    try:
        rs.add_server("s/1", "node-1", 4242, "s", 1)  # the server was recorded while there was room
        _fill(mounted)  # then its log filled the disk
        try:
            rs.remove_server("s/1")  # what _run_one's `finally` does when the trial ends
        finally:
            leftovers = [p.name for p in (mounted / "artifacts").iterdir() if p.name.endswith(".tmp")]
        assert leftovers == []
        assert rs.servers() == {} and rs.unwritten  # kept in memory, and it says the write failed
    finally:
        rs.release()


def test_the_driver_waits_for_space_only_when_its_own_disk_is_full(mounted, monkeypatch):
    """driver/recovery.wait_for_disk: False at once when the artifacts dir takes writes (the trial's node
    refused: counted as infra by the caller), True after waiting out a full disk."""
    from types import SimpleNamespace

    from optimizer.driver import recovery as study_mod
    from optimizer.driver.progress import Progress

    monkeypatch.setattr(study_mod, "DISK_POLL_S", 0.1)
    plan = SimpleNamespace(artifacts=mounted / "study")
    progress = Progress(Console(file=open(os.devnull, "w")))
    assert study_mod.wait_for_disk(plan, progress) is False
    _fill(mounted)
    freed = threading.Timer(0.5, lambda: (mounted / "filler").unlink())
    freed.start()
    t = time.monotonic()
    assert study_mod.wait_for_disk(plan, progress) is True
    assert 0.4 < time.monotonic() - t < 5
