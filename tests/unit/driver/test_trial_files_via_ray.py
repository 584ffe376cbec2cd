"""A trial's artifacts come back to the driver in its result (through Ray), not through a
shared filesystem: a trial on another node logs to node-local scratch, its log text and
request records travel in the TrialResult, and the driver stores them (artifacts.store_trial).
The TrialResult goes through pickle here, as Ray sends it."""

import json
import os
import pickle
import socket
from pathlib import Path

from optimizer.driver.store.trial_files import store_trial
from optimizer.measure.replay import RequestRecord
from optimizer.trial.spec import TrialResult, TrialSpec
from optimizer.trial.task import capped_log, node_log_path
from optimizer.workload import Workload

RECORDS = (RequestRecord("r0", 0.0, 0.01, 0.05, 0.4, (0.05, 0.4), 12, 2, 2, True, 200),
           RequestRecord("r1", 0.1, 0.11, None, None, (), 9, 0, 4, False, 500, "HTTP 500"))
LOG = "# launched: python -m vllm.entrypoints.openai.api_server --model m\nINFO ready\n"


def spec_for(driver_host: str, log_path: str = "/data/artifacts/s/trial-3/server.log") -> TrialSpec:
    return TrialSpec(number=3, model="m", params={}, vllm_args=(), workload=Workload(name="w", requests=(), warmup=(), concurrency=1),
                     log_path=log_path, driver_host=driver_host)


def _travelled(host: str, **kw) -> TrialResult:
    result = TrialResult(3, None, {"output_throughput": 1.0}, host=host, records=RECORDS, log_text=LOG, **kw)
    return pickle.loads(pickle.dumps(result))


def test_a_trial_on_another_node_logs_to_node_local_scratch():
    here = socket.gethostname()
    assert node_log_path(spec_for(here)) == Path("/data/artifacts/s/trial-3/server.log")  # the driver's machine
    assert node_log_path(spec_for("")) == Path("/data/artifacts/s/trial-3/server.log")  # no driver named
    away = node_log_path(spec_for("head-node"), host="gpu-worker-7")
    assert away.name == "server.log" and f"vllm-optimizer-{os.getuid()}" in away.parts and not str(away).startswith("/data")
    # One scratch file per trial log (two trials on one node do not share it).
    assert away != node_log_path(spec_for("head-node", "/data/artifacts/s/trial-4/server.log"), host="gpu-worker-7")


def test_the_driver_stores_what_a_remote_trial_sent_back(tmp_path):
    trial_dir = tmp_path / "artifacts" / "s" / "trial-3"
    assert store_trial(trial_dir, {"max-num-seqs": 8}, _travelled("gpu-worker-7"), driver_host="head-node") is None
    assert (trial_dir / "server.log").read_text() == LOG
    lines = [json.loads(line) for line in (trial_dir / "requests.jsonl").read_text().splitlines()]
    assert [r["id"] for r in lines] == ["r0", "r1"]
    assert lines[0]["first_chunk_s"] == 0.05 and lines[1]["ok"] is False and lines[1]["error"] == "HTTP 500"
    assert json.loads((trial_dir / "result.json").read_text())["host"] == "gpu-worker-7"


def test_on_the_driver_s_machine_the_live_log_is_kept(tmp_path):
    trial_dir = tmp_path / "trial-3"
    trial_dir.mkdir()
    (trial_dir / "server.log").write_text(LOG + "INFO the live file, written by the trial\n")
    assert store_trial(trial_dir, {}, _travelled("head-node"), driver_host="head-node") is None
    assert (trial_dir / "server.log").read_text().endswith("written by the trial\n")
    assert (trial_dir / "requests.jsonl").exists()


def test_a_huge_log_travels_as_its_start_and_its_end():
    text = "# launched: vllm\n" + "".join(f"line {i}\n" for i in range(100_000))
    capped = capped_log(text, limit=20_000)
    assert len(capped) < 20_200
    assert capped.startswith("# launched: vllm\n") and capped.endswith("line 99999\n")
    assert "characters left out" in capped
    assert capped_log(LOG) == LOG
