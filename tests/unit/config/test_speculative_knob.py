"""The `speculative-config` knob (config/space.py, config/flags.py, engine/speculative_config.py):
opt-in, "off" or the JSON vLLM takes, every choice checked before a boot, "off" never a flag,
and the flag as written parsed by vLLM's own `serve` parser from best.yaml."""

from __future__ import annotations

import json
import shlex

import optuna
import pytest
import yaml

from optimizer.config.flags import from_cli_args, to_cli_args
from optimizer.config.schema import StudyConfig
from optimizer.config.space import DEFAULT_KNOBS, resolve
from optimizer.search.suggest import suggest
from optimizer.engine import speculative_config as speculation
from optimizer.errors import ConfigError
from optimizer.deploy.serve import serve_yaml
from tests.unit.config.test_space import LONGEST, MODEL, cpu
from tests.unit.report.test_written_report import parse_with_vllm

NGRAM_3 = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}'


def _space(spec, baseline=None):
    cfg = StudyConfig(model={"path": "tiny"}, space={"max-num-seqs": {}, "speculative-config": spec}, baseline=baseline)
    return {d.knob.name: d for d in resolve(cfg, cpu(), MODEL, LONGEST).dims}


def test_it_is_opt_in_and_its_defaults_are_off_and_two_ngram_sizes():
    assert "speculative-config" not in DEFAULT_KNOBS
    d = _space({})["speculative-config"]
    assert d.choices == speculation.DEFAULT_CHOICES and d.choices[0] == "off"
    assert [json.loads(c)["num_speculative_tokens"] for c in d.choices[1:]] == [2, 4]


def test_given_choices_are_kept_as_written_and_a_bad_one_is_one_line():
    assert _space({"choices": ["off", NGRAM_3]})["speculative-config"].choices == ("off", NGRAM_3)
    with pytest.raises(ConfigError) as exc:
        _space({"choices": ["off", '{"method": "ngram", "num_speculative_tokens": 0}']})
    assert str(exc.value).startswith("space.speculative-config {") and "num_speculative_tokens is 0" in str(exc.value)
    with pytest.raises(ConfigError, match='give "off" or the JSON text of a speculative config'):
        _space({"choices": ["off", 4]})


def test_a_baseline_outside_the_choices_is_refused():
    with pytest.raises(ConfigError, match="speculative-config"):
        _space({"choices": ["off", NGRAM_3]}, baseline={"speculative-config": '{"method": "ngram"}'})


def test_off_is_no_flag_and_a_config_is_the_flag_vllm_reads():
    assert to_cli_args({"max-num-seqs": 8, "speculative-config": "off"}) == ["--max-num-seqs", "8"]
    args = to_cli_args({"speculative-config": NGRAM_3})
    assert args == ["--speculative-config", NGRAM_3]
    assert from_cli_args(args) == {"speculative-config": NGRAM_3}


def test_every_draw_is_one_of_the_choices():
    space = resolve(StudyConfig(model={"path": "tiny"}, space={"speculative-config": {}}), cpu(), MODEL, LONGEST)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    drawn = {suggest(study.ask(), space)["speculative-config"] for _ in range(30)}
    assert drawn == set(speculation.DEFAULT_CHOICES)


def test_vllm_parses_it_from_best_yaml(tmp_path, tiny_model):
    path = tmp_path / "best.yaml"
    path.write_text(yaml.safe_dump(serve_yaml(to_cli_args({"max-num-seqs": 8, "speculative-config": NGRAM_3}))))
    ns = parse_with_vllm(str(tiny_model), path)
    assert ns.max_num_seqs == 8 and ns.speculative_config == json.loads(NGRAM_3)


def test_the_deploy_command_quotes_it_for_a_shell():
    from optimizer.deploy.serve import serve_command

    args = to_cli_args({"max-num-seqs": 8, "speculative-config": NGRAM_3})
    command = serve_command("/models/m", args)
    assert shlex.split(command) == ["vllm", "serve", "/models/m", *args]
    assert serve_command("/models/m", ["--max-num-seqs", "8"]) == "vllm serve /models/m --max-num-seqs 8"
