"""cli/: bad input -> exit 2, one `error:` line on stderr, and nothing written (no study, no artifacts)."""

import pytest
import ray

from optimizer.cli import main

GOOD_SPACE = "space: {max-num-seqs: {low: 4, high: 8}}\n"  # keeps the node's memory out of these tests


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty working directory: relative defaults (trials.db, artifacts/) would land here."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_cli(workdir, capsys, config: str, *flags: str):
    (workdir / "study.yaml").write_text(config)
    db = workdir / "study.db"
    code = main(["run", "--config", str(workdir / "study.yaml"), "--storage", f"sqlite:///{db}", *flags])
    err = capsys.readouterr().err.splitlines()
    return code, err


def assert_refused(code, err, *words):
    assert code == 2
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert all(w in err[0] for w in words), err[0]


@pytest.mark.parametrize("config, flags, words", [
    ("model: {path: /m}\nn_trails: 4\n", (), ("n_trails", "unknown key")),
    ("model: {path: /m}\nn_trials: many\n", (), ("n_trials",)),
    ("model: {path: /m}\nspace: {max-num-seqs: {low: 64, high: 8}}\n", (), ("space.max-num-seqs", "above high")),
    ("model: {path: /m}\n", ("--objective", "fastest"), ("objective", "fastest", "throughput")),
    ("model: {path: /m}\nobjective: latency\n", ("--metric", "ttft_p95"), ("objective",)),
], ids=["unknown-key", "wrong-type", "inverted-range", "unknown-objective", "flag-into-scalar-section"])
def test_bad_config_or_flag(workdir, capsys, config, flags, words):
    code, err = run_cli(workdir, capsys, config, *flags)
    assert_refused(code, err, *words)
    assert sorted(p.name for p in workdir.iterdir()) == ["study.yaml"]


def test_missing_model_directory(workdir, capsys):
    missing = workdir / "models" / "nope"
    code, err = run_cli(workdir, capsys, GOOD_SPACE, "--model", str(missing))
    assert_refused(code, err, "model", str(missing), "does not exist")
    assert sorted(p.name for p in workdir.iterdir()) == ["study.yaml"]


def test_unknown_knob_with_a_valid_model(workdir, capsys, tiny_model):
    code, err = run_cli(workdir, capsys, "space: {max-batch-size: {low: 1, high: 8}}\n", "--model", str(tiny_model))
    assert_refused(code, err, "max-batch-size")
    assert sorted(p.name for p in workdir.iterdir()) == ["study.yaml"]


def test_storage_in_a_missing_directory(workdir, capsys, tiny_model):
    (workdir / "study.yaml").write_text(GOOD_SPACE)
    code = main(["run", "--config", "study.yaml", "--model", str(tiny_model), "--storage", "sqlite:///no/dir/t.db"])
    assert_refused(code, capsys.readouterr().err.splitlines(), "storage", "does not exist")
    assert sorted(p.name for p in workdir.iterdir()) == ["study.yaml"]


def test_damaged_study_database_is_left_alone_and_ray_never_starts(workdir, capsys, tiny_model):
    db = workdir / "study.db"
    db.write_bytes(b"this is not sqlite\n" * 100)
    before = db.read_bytes()
    code, err = run_cli(workdir, capsys, GOOD_SPACE, "--model", str(tiny_model))
    assert_refused(code, err, str(db), "not a SQLite database")
    assert db.read_bytes() == before
    assert sorted(p.name for p in workdir.iterdir()) == ["study.db", "study.yaml"]
    assert not ray.is_initialized()


def test_model_flag_is_never_generated_over(workdir, capsys):
    # the config asks to generate a tiny model, but --model names another: nothing is written there
    missing = workdir / "their-model"
    code, err = run_cli(workdir, capsys, "model: {path: models/tiny, tiny: true}\n" + GOOD_SPACE, "--model", str(missing))
    assert_refused(code, err, "does not exist")
    assert not missing.exists() and not (workdir / "models").exists()


@pytest.mark.parametrize("trace, words", [
    ("missing.jsonl", ("trace", "missing.jsonl", "check the path")),
    ("junk.txt", ("trace", "unknown format", "workload.format")),
    ("bad.jsonl", ("malformed rows", "line 3", "--skip-bad-rows")),
], ids=["unreadable-trace", "unknown-format", "malformed-rows"])
def test_bad_trace(workdir, capsys, tiny_model, trace, words):
    (workdir / "junk.txt").write_text("hello\n")
    (workdir / "bad.jsonl").write_text('{"input_tokens": 10, "output_tokens": 5}\n{"input_tokens": 10, "output_tokens": 5}\n'
                                       '{"input_tokens": "ten", "output_tokens": 5}\n')
    config = GOOD_SPACE + f"workload: {{scenario: trace, path: {workdir / trace}, arrival: {{process: closed, concurrency: 2}}}}\n"
    code, err = run_cli(workdir, capsys, config, "--model", str(tiny_model))
    assert_refused(code, err, *words)
    assert sorted(p.name for p in workdir.iterdir()) == sorted(["study.yaml", "junk.txt", "bad.jsonl"])


def test_workload_flag_swaps_the_section_and_the_workload_command_writes_it(workdir, capsys, tiny_model):
    (workdir / "study.yaml").write_text(GOOD_SPACE + "workload: {requests: 5}\n")
    (workdir / "burst.yaml").write_text("workload: {scenario: burst, requests: 7, input: [8, 16], output: [4, 8]}\n")
    code = main(["workload", "--config", "study.yaml", "--model", str(tiny_model), "--workload", "burst.yaml",
                 "--out", str(workdir / "out")])
    out = capsys.readouterr().out
    assert code == 0 and "burst: 7 requests" in out
    written = list((workdir / "out").glob("workload-*.jsonl"))
    assert len(written) == 1 and written[0].name[9:21] in out  # the hash it prints is the file's


@pytest.mark.parametrize("section, flags, words", [
    ("workload: chat\n", ("--skip-bad-rows",), ("--workload", "must be a mapping")),
    ("workload: {scenario: chat, requests: 4}\n", ("--skip-bad-rows",), ("--skip-bad-rows", "'trace' only")),
    ("workload: {arrival: {process: poisson, rate: 4, burstiness: 0.3}}\n", (), ("burstiness", "does not apply")),
], ids=["workload-not-a-mapping", "skip-bad-rows-without-trace", "knob-of-another-process"])
def test_bad_workload_flags(workdir, capsys, tiny_model, section, flags, words):
    (workdir / "w.yaml").write_text(section)
    code, err = run_cli(workdir, capsys, GOOD_SPACE, "--model", str(tiny_model), "--workload",
                        str(workdir / "w.yaml"), *flags)
    assert_refused(code, err, *words)
    assert sorted(p.name for p in workdir.iterdir()) == ["study.yaml", "w.yaml"]


def test_skip_bad_rows_replays_the_good_rows_and_lists_the_bad(workdir, capsys, tiny_model):
    (workdir / "t.jsonl").write_text('{"input_tokens": 10, "output_tokens": 5}\n{"input_tokens": "x", "output_tokens": 5}\n')
    (workdir / "w.yaml").write_text(f"workload: {{scenario: trace, path: {workdir / 't.jsonl'}, "
                                    "arrival: {process: closed, concurrency: 1}}\n")
    (workdir / "study.yaml").write_text(GOOD_SPACE)
    code = main(["workload", "--config", "study.yaml", "--model", str(tiny_model), "--workload", "w.yaml",
                 "--skip-bad-rows", "--out", str(workdir)])
    out = capsys.readouterr().out
    assert code == 0 and "1 measured requests" in out and "1 malformed rows skipped (line 2:" in out


@pytest.mark.parametrize("config, flags, words", [
    ("", ("--slo", "ttft:fast"), ("slo 'ttft:fast'", "not a number")),
    ("", ("--slo", "ttfb:500"), ("slo 'ttfb:500'", "ttft, tpot")),
    ("", ("--objective", "goodput"), ("goodput", "needs SLOs", "--slo")),
    ("workload: {requests: 8, arrival: {process: closed, concurrency: 4}}\n", ("--objective", "goodput", "--slo", "ttft:500"),
     ("goodput", "open-loop", "poisson")),
    ("", ("--objective", "pareto", "--metric", "ttft_p42"), ("pareto", "ttft_p42")),
], ids=["slo-not-a-number", "slo-unknown-metric", "goodput-without-slos", "goodput-on-a-closed-loop",
        "pareto-bad-metric"])
def test_bad_objective_or_slo(workdir, capsys, tiny_model, config, flags, words):
    code, err = run_cli(workdir, capsys, GOOD_SPACE + config, "--model", str(tiny_model), *flags)
    assert_refused(code, err, *words)
    assert sorted(p.name for p in workdir.iterdir()) == ["study.yaml"]


def test_a_relative_artifacts_dir_in_a_ray_job_is_warned_about_and_the_flag_overrides_it(monkeypatch, tmp_path):
    import io

    from rich.console import Console

    from optimizer.cli.entry import parser as _parser
    from optimizer.cli.run import _warn_relative_artifacts
    from optimizer.config.schema import StudyConfig

    out = io.StringIO()
    cfg = StudyConfig.model_validate({"model": {"path": "/m"}})
    _warn_relative_artifacts(cfg, Console(file=out))
    assert out.getvalue() == ""  # not a job: relative is fine
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", '{"runtime_env": {"working_dir": "gcs://_ray_pkg_1"}}')
    _warn_relative_artifacts(cfg, Console(file=out, width=300))
    assert "artifacts_dir 'artifacts' is relative" in out.getvalue() and "--artifacts-dir" in out.getvalue()
    absolute = StudyConfig.model_validate({"model": {"path": "/m"}, "artifacts_dir": str(tmp_path)})
    quiet = io.StringIO()
    _warn_relative_artifacts(absolute, Console(file=quiet))
    assert quiet.getvalue() == ""
    ns = _parser().parse_args(["run", "--config", "c.yaml", "--artifacts-dir", "/data/a"])
    assert ns.artifacts_dir == "/data/a"


def test_regress_refuses_a_knob_typo_before_anything_boots(workdir, capsys, tiny_model, monkeypatch):
    # vLLM would read --max-num-seq as --max-num-seqs: refused here, never planned, never booted
    from optimizer.cli import regress
    from optimizer.driver import plan

    def booted(*_):
        raise AssertionError("regress went past the door")
    monkeypatch.setattr(plan, "prepare", booted)
    monkeypatch.setattr(regress, "answer", booted)
    (workdir / "study.yaml").write_text(GOOD_SPACE)
    code = main(["regress", "--config", "study.yaml", "--model", str(tiny_model), "--candidate", "kv-cache-dtype=fp8",
                 "--candidate", "max-num-seq=8"])
    assert_refused(code, capsys.readouterr().err.splitlines(), "--candidate 'max-num-seq=8'",
                   "unknown parameter 'max-num-seq'", "did you mean 'max-num-seqs'?", "known: max-num-seqs, ")
    assert sorted(p.name for p in workdir.iterdir()) == ["study.yaml"]
