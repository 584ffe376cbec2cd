"""config/schema.py: YAML + dotted CLI overrides -> StudyConfig, or one ConfigError naming the field."""

import pytest

from optimizer.config.schema import load_config
from optimizer.errors import ConfigError

VALID = "model: {path: /models/tiny}\n"


def write(tmp_path, text: str | bytes, name: str = "study.yaml"):
    p = tmp_path / name
    p.write_bytes(text) if isinstance(text, bytes) else p.write_text(text)
    return p


def test_minimal_file_gets_the_documented_defaults(tmp_path):
    cfg = load_config(write(tmp_path, VALID))
    assert cfg.model.path == "/models/tiny"
    assert (cfg.objective.name, cfg.n_trials, cfg.storage) == ("throughput", 8, "sqlite:///trials.db")
    assert (cfg.workload.arrival.process, cfg.workload.arrival.concurrency) == ("closed", 32)


@pytest.mark.parametrize("text, field, words", [
    (VALID + "n_trails: 4\n", "n_trails", "unknown key"),
    (VALID + "workload: {requests: 8, sede: 1}\n", "workload.sede", "unknown key"),
    (VALID + "n_trials: many\n", "n_trials", "valid integer"),
    (VALID + "engine: {startup_timeout_s: -5}\n", "engine.startup_timeout_s", "greater than 0"),
    (VALID + "space: {max-num-seqs: {low: 64, high: 8}}\n", "space.max-num-seqs", "above high"),
    (VALID + "space: {kv-cache-dtype: {choices: []}}\n", "space.kv-cache-dtype", "choices is empty"),
    (VALID + "workload: {output: [128, 32]}\n", "workload", "output [128, 32]"),
    (VALID + "workload: {arrival: {process: poisson}}\n", "workload.arrival", "needs rate"),
    ("n_trials: 3\n", "model", "required key is missing"),
])
def test_bad_field_is_named(tmp_path, text, field, words):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    msg = str(err.value)
    assert f"field '{field}'" in msg and words in msg
    assert "\n" not in msg


def test_malformed_yaml_names_the_line(tmp_path):
    with pytest.raises(ConfigError, match=r"study\.yaml: malformed YAML at line 2;"):
        load_config(write(tmp_path, VALID + "objective: name: latency\n"))


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n"])
def test_top_level_must_be_a_mapping(tmp_path, text):
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(write(tmp_path, text))


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read it"):
        load_config(tmp_path / "nope.yaml")


def test_binary_file_is_a_config_error_not_a_traceback(tmp_path):
    # e.g. `--config trials.db` by mistake: not UTF-8 text.
    with pytest.raises(ConfigError, match="study.yaml"):
        load_config(write(tmp_path, b"SQLite format 3\x00\xff\xfe\x80\x81"))


def test_dotted_overrides_beat_the_file_and_create_sections(tmp_path):
    path = write(tmp_path, VALID + "n_trials: 4\nobjective: {name: throughput}\n")
    cfg = load_config(path, {"model.path": "/other", "n_trials": 12, "objective.name": "latency",
                             "objective.metric": "e2el_p95", "ray.address": "ray://head:10001"})
    assert (cfg.model.path, cfg.n_trials) == ("/other", 12)
    assert (cfg.objective.name, cfg.objective.metric) == ("latency", "e2el_p95")
    assert cfg.ray.address == "ray://head:10001"


def test_flags_alone_are_a_config(tmp_path):
    assert load_config(None, {"model.path": "/m"}).model.path == "/m"
    with pytest.raises(ConfigError, match=r"config <flags>: field 'n_trials'"):
        load_config(None, {"model.path": "/m", "n_trials": 0})


def test_override_into_a_scalar_section_is_a_config_error(tmp_path):
    # `objective: latency` in the file plus `--metric ttft_p95` on the command line.
    path = write(tmp_path, VALID + "objective: latency\n")
    with pytest.raises(ConfigError, match="objective"):
        load_config(path, {"objective.metric": "ttft_p95"})
