"""Knob names are exact: a name that is not a knob's is one ConfigError naming the closest knob and
the known ones, wherever it comes in (space, baseline, enqueue, --candidate, --to, a trial's flags);
vLLM would take `--max-num-seq` as its abbreviation of `--max-num-seqs`, so nothing may reach it."""

import pytest

from optimizer.config.candidate import parse_candidate
from optimizer.config.flags import to_cli_args
from optimizer.config.schema import StudyConfig
from optimizer.config.space import KNOBS, resolve
from optimizer.errors import ConfigError
from tests.unit.config.test_space import LONGEST, MODEL, cpu

KNOWN = "known: " + ", ".join(KNOBS)


def test_a_candidate_knob_typo_is_refused_with_the_closest_name():
    with pytest.raises(ConfigError) as exc:
        parse_candidate("max-num-seq=8")
    assert str(exc.value) == f"--candidate 'max-num-seq=8': unknown parameter 'max-num-seq'; did you mean " \
                             f"'max-num-seqs'? {KNOWN}"
    with pytest.raises(ConfigError, match=r"^--to 'gpu-memory-util=0.5': unknown parameter 'gpu-memory-util'; "
                                          r"did you mean 'gpu-memory-utilization'\?"):
        parse_candidate("gpu-memory-util=0.5", "--to")
    with pytest.raises(ConfigError, match=r"unknown parameter 'enforce-eager'; known: max-num-seqs, "):
        parse_candidate("enforce-eager=true")  # not a knob: no longer passed to vLLM as written


@pytest.mark.parametrize("section, where", [
    ({"space": {"max-num-seq": {}}}, "space"),
    ({"baseline": {"max-num-seq": 8}}, "baseline"),
    ({"space": {"max-num-seqs": {}}, "enqueue": [{"max-num-seq": 8}]}, "enqueue.0"),
], ids=["space", "baseline", "enqueue"])
def test_the_config_refuses_a_knob_typo_by_the_same_rule(section, where):
    with pytest.raises(ConfigError) as exc:
        resolve(StudyConfig(model={"path": "tiny"}, **section), cpu(), MODEL, LONGEST)
    assert str(exc.value) == f"{where}: unknown parameter 'max-num-seq'; did you mean 'max-num-seqs'? {KNOWN}"


@pytest.mark.parametrize("flag, knob", [("--max-num-seq", "max-num-seqs"), ("--max-num-seq=8", "max-num-seqs"),
                                        ("--no-enable-prefix", "enable-prefix-caching")])
def test_an_extra_arg_that_only_starts_a_knobs_name_is_refused(flag, knob):
    cfg = StudyConfig(model={"path": "tiny"}, engine={"extra_args": [flag, "8"] if "=" not in flag else [flag]})
    with pytest.raises(ConfigError, match=rf"^engine.extra_args: '{flag}' only starts --{knob} \(vLLM takes it"):
        resolve(cfg, cpu(), MODEL, LONGEST)
    full = StudyConfig(model={"path": "tiny"}, engine={"extra_args": ["--max-num-seqs", "8", "--enforce-eager"]})
    assert resolve(full, cpu(), MODEL, LONGEST).dims


def test_only_exact_knob_names_become_vllm_flags():
    assert to_cli_args({"max-num-seqs": 8}) == ["--max-num-seqs", "8"]
    with pytest.raises(ConfigError, match="unknown parameter 'max-num-seq'; did you mean 'max-num-seqs'"):
        to_cli_args({"max-num-seq": 8})
