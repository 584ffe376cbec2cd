"""engine/speculative_config.py: a `--speculative-config` in engine.extra_args is checked before anything
boots; each mistake is one line naming the fix, exit 2, and nothing is written."""

from __future__ import annotations

import json

import pytest
import ray

from optimizer.cli import main
from optimizer.config.schema import SpeculationSpec
from optimizer.engine import speculative_config as speculation
from optimizer.errors import ConfigError

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def test_a_good_config_passes_and_comes_back_parsed():
    assert speculation.check_args(["--enforce-eager", "--speculative-config", json.dumps(NGRAM)], "x") == NGRAM
    assert speculation.check_args([f"--speculative-config={json.dumps(NGRAM)}"], "x") == NGRAM
    assert speculation.check_args(["--enforce-eager"], "x") is None
    assert speculation.check(json.dumps({"method": "deepseek_mtp", "num_speculative_tokens": 1}), "x")


@pytest.mark.parametrize("value, words", [
    ("{method: ngram}", ("not JSON", "give one JSON object")),
    ("[1, 2]", ("give one JSON object, not list",)),
    ('{"num_speculative_tokens": 4}', ('give "method"',)),
    ('{"method": "ngrams", "num_speculative_tokens": 4}', ("unknown method 'ngrams'", "ngram, ngram_gpu")),
    ('{"method": "ngram", "num_speculative_tokens": 0}', ("num_speculative_tokens is 0", "at least 1")),
    ('{"method": "ngram", "num_speculative_tokens": 2.5}', ("num_speculative_tokens is 2.5",)),
    ('{"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 3}',
     ("prompt_lookup_min (5) is above prompt_lookup_max (3)",)),
    ('{"method": "draft_model", "num_speculative_tokens": 4}', ("drafts with a second model", '"model"')),
], ids=["not-json", "not-object", "no-method", "unknown-method", "zero-tokens", "fractional", "lookup-order",
        "draft-without-model"])
def test_each_mistake_is_one_line_naming_the_fix(value, words):
    with pytest.raises(ConfigError) as exc:
        speculation.check_args(["--speculative-config", value], "engine.extra_args")
    line = str(exc.value)
    assert "\n" not in line and line.startswith("engine.extra_args --speculative-config: ")
    assert all(w in line for w in words), line


def test_suffix_without_its_package_names_the_package(monkeypatch):
    monkeypatch.setattr(speculation.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"'suffix' needs the package arctic-inference; run `pip install "):
        speculation.check('{"method": "suffix", "num_speculative_tokens": 4}', "x")


def test_a_local_draft_with_another_vocabulary_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 32000}))
    draft = json.dumps({"method": "draft_model", "model": str(tmp_path), "num_speculative_tokens": 3})
    with pytest.raises(ConfigError, match="vocabulary of 32000 tokens, the target 49152"):
        speculation.check(draft, "x", target_vocab=49152)
    assert speculation.check(draft, "x", target_vocab=32000)["model"] == str(tmp_path)


def _run(tmp_path, monkeypatch, capsys, model, space: str, extra: str) -> tuple[int, list[str]]:
    """`run` in an empty directory with `space` and `--speculative-config extra`; its exit code and stderr lines."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "study.yaml").write_text(f"space: {space}\nengine: {{extra_args: ['--speculative-config', '{extra}']}}\n")
    code = main(["run", "--config", "study.yaml", "--model", str(model), "--storage", f"sqlite:///{tmp_path / 'study.db'}"])
    return code, capsys.readouterr().err.splitlines()


def test_run_refuses_it_before_anything_starts(tmp_path, monkeypatch, capsys, tiny_model):
    bad = json.dumps({"method": "ngram", "num_speculative_tokens": 0})
    code, err = _run(tmp_path, monkeypatch, capsys, tiny_model, "{max-num-seqs: {low: 4, high: 8}}", bad)
    assert code == 2 and len(err) == 1 and "num_speculative_tokens is 0" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.yaml"]
    assert not ray.is_initialized()


def test_the_troubleshooting_table_quotes_the_real_lines(tmp_path, monkeypatch):
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[3] / "docs" / "troubleshooting.md").read_text()
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"vocab_size": 32000}))
    cases = ['{"method": "ngram", "num_speculative_tokens": 0}', '{"method": "ngrams"}',
             '{"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 3}',
             '{"method": "draft_model", "num_speculative_tokens": 4}',
             json.dumps({"method": "draft_model", "model": str(draft), "num_speculative_tokens": 4}),
             json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                         "num_speculative_tokens_per_batch_size": [[1, 8, 4], [8, 64, 0]]})]
    lines = []
    for value in cases:
        with pytest.raises(ConfigError) as exc:
            speculation.check_args(["--speculative-config", value], "engine.extra_args", 49152)
        lines.append(str(exc.value).replace(str(tmp_path), "<dir>"))
    monkeypatch.setattr(speculation.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError) as exc:
        speculation.check_args(["--speculative-config", '{"method": "suffix", "num_speculative_tokens": 4}'],
                               "engine.extra_args")
    lines.append(str(exc.value))
    with pytest.raises(ConfigError) as exc:
        speculation.sub_space(SpeculationSpec(methods=["mtp"]), str(tmp_path), 49152)
    lines.append(str(exc.value))
    for line in lines:
        assert f"`` error: {line} ``" in docs, line


def test_held_fixed_and_searched_at_once_is_refused(tmp_path, monkeypatch, capsys, tiny_model):
    code, err = _run(tmp_path, monkeypatch, capsys, tiny_model, "{speculative-config: {}}", json.dumps(NGRAM))
    assert code == 2 and len(err) == 1 and "also searched (space.speculative-config)" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.yaml"]
