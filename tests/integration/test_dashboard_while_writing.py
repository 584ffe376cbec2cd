"""optuna-dashboard open on the same trials.db while the driver writes: no write fails, no
trial is lost, and the dashboard keeps answering. A real optuna-dashboard process reading
over its HTTP API as fast as it can; the driver's writes as the driver makes them (ask, user
attributes, report, tell) through `open_storage` (WAL mode, busy timeout). No vLLM, no Ray."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import optuna
import pytest

from optimizer.driver.store.database import open_storage
from optimizer.engine.vllm import free_port

pytestmark = pytest.mark.integration
TRIALS = 150


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        return json.loads(resp.read())


def test_the_dashboard_reads_while_the_driver_writes(tmp_path):
    db = tmp_path / "trials.db"
    storage = open_storage(f"sqlite:///{db}")
    study = optuna.create_study(study_name="busy", storage=storage, direction="maximize")
    exe = shutil.which("optuna-dashboard", path=str(Path(sys.executable).parent))
    port = free_port()
    dash = subprocess.Popen([exe, f"sqlite:///{db}", "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}/api/studies"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                studies = _get(base)["study_summaries"]
                break
            except OSError:
                assert dash.poll() is None and time.monotonic() < deadline, dash.stderr.read()[-2000:]
                time.sleep(0.2)
        study_id = studies[0]["study_id"]
        reads, errors, stop = [0], [], threading.Event()

        def read_all_the_time():
            while not stop.is_set():
                try:
                    _get(f"{base}/{study_id}")
                    reads[0] += 1
                except Exception as exc:  # noqa: BLE001 - every failure is the finding
                    errors.append(repr(exc))

        reader = threading.Thread(target=read_all_the_time)
        reader.start()
        try:
            for i in range(TRIALS):  # what the driver writes per trial
                trial = study.ask()
                trial.set_user_attr("metrics", {"output_throughput": float(i), "ttft_ms_p95": 100.0 + i})
                trial.set_user_attr("phases_s", {"startup_s": 60.0, "replay_s": 15.0})
                trial.report(float(i) / 2, 1)
                study.tell(trial, float(i))
        finally:
            stop.set()
            reader.join(timeout=30)
        deadline = time.monotonic() + 60  # the dashboard caches trial lists for a few seconds
        while len((final := _get(f"{base}/{study_id}"))["trials"]) < TRIALS and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        dash.terminate()
        dash.wait(timeout=30)
    assert errors == []
    assert reads[0] >= 10, f"the dashboard answered only {reads[0]} reads while the study was written"
    told = optuna.load_study(study_name="busy", storage=f"sqlite:///{db}").trials
    assert [t.value for t in told] == [float(i) for i in range(TRIALS)]
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in told)
    assert len(final["trials"]) == TRIALS
