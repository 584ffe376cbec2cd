"""Config `speculation:`: the speculative-config knob's sub-space (engine/speculative_config.py
`sub_space`): off, then each method that can run here with each draft length, lookup window and
per-batch-size schedule; what cannot run is left out with the fix named, or refused when asked for."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace

import pytest

from optimizer.config.schema import StudyConfig, load_config
from optimizer.config.space import resolve
from optimizer.engine import speculative_config as speculation
from optimizer.errors import ConfigError
from tests.unit.config.test_space import LONGEST, MODEL, cpu

NO_ARCTIC = importlib.util.find_spec("arctic_inference") is None


def _resolve(section: dict | None, model=MODEL):
    data = {"model": {"path": "tiny"}, "space": {"speculative-config": {}}}
    if section is not None:
        data["speculation"] = section
    space = resolve(StudyConfig(**data), cpu(), model, LONGEST)
    return {d.knob.name: d for d in space.dims}["speculative-config"].choices, space.notes


def _model_dir(tmp_path, **config):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": MODEL.vocab_size, **config}))
    return str(tmp_path)


def test_without_a_section_the_choices_are_off_and_ngram_2_and_4_and_the_rest_is_named_with_its_fix():
    choices, notes = _resolve(None)
    suffix = () if NO_ARCTIC else ('{"method": "suffix", "num_speculative_tokens": 2}',
                                   '{"method": "suffix", "num_speculative_tokens": 4}')
    assert choices == speculation.DEFAULT_CHOICES + suffix
    (note,) = [n for n in notes if n.startswith("speculative-config:")]
    assert note.startswith(f"speculative-config: off and {'ngram' if NO_ARCTIC else 'ngram, suffix'} searched; "
                           "left out: ")
    assert "mtp (the model has no MTP layers (its config.json declares none); use ngram or a draft model)" in note
    assert "draft_model (give its path as speculation.draft_model)" in note
    assert "eagle3 (give its path as speculation.eagle3_head)" in note
    if NO_ARCTIC:
        assert "suffix (needs the package arctic-inference: pip install arctic-inference)" in note


def test_lengths_windows_and_schedules_multiply_and_every_choice_passes_vllms_rules():
    choices, _ = _resolve({"methods": ["ngram"], "num_speculative_tokens": [1, 3], "prompt_lookup": [[1, 2], [2, 5]],
                           "per_batch_size": [4, 16]})
    assert choices[0] == "off" and len(choices) == 1 + 2 * 2 * 3
    configs = [json.loads(c) for c in choices[1:]]
    assert {(c["num_speculative_tokens"], c["prompt_lookup_min"], c["prompt_lookup_max"]) for c in configs} == \
        {(k, lo, hi) for k in (1, 3) for lo, hi in ((1, 2), (2, 5))}
    scheduled = [c for c in configs if "num_speculative_tokens_per_batch_size" in c]
    assert len(scheduled) == 8
    k3_at_16 = next(c for c in scheduled if c["num_speculative_tokens"] == 3
                    and c["num_speculative_tokens_per_batch_size"][0][1] == 16)
    assert k3_at_16["num_speculative_tokens_per_batch_size"] == [[1, 16, 3], [17, 17, 0]]  # none above 16 running
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup  # vLLM's own reading of it

    lookup = build_dynamic_sd_schedule_lookup(k3_at_16["num_speculative_tokens_per_batch_size"], 64, 3)
    assert lookup[1] == lookup[16] == 3 and lookup[17] == lookup[64] == 0


def test_a_draft_model_of_the_same_vocabulary_is_searched_and_another_vocabulary_is_one_line(tmp_path):
    same = _model_dir(tmp_path / "draft")
    choices, notes = _resolve({"methods": ["ngram", "draft_model"], "draft_model": same, "num_speculative_tokens": [3]})
    drafts = [json.loads(c) for c in choices if '"draft_model"' in c]
    assert drafts == [{"method": "draft_model", "num_speculative_tokens": 3, "model": same}]
    assert not [n for n in notes if n.startswith("speculative-config:")]  # nothing asked for was left out
    other = _model_dir(tmp_path / "other", vocab_size=MODEL.vocab_size + 1)
    with pytest.raises(ConfigError) as exc:
        _resolve({"methods": ["draft_model"], "draft_model": other})
    assert "\n" not in str(exc.value) and f"a vocabulary of {MODEL.vocab_size + 1} tokens" in str(exc.value)


def test_a_method_asked_for_that_cannot_run_is_refused_with_its_fix():
    with pytest.raises(ConfigError, match="speculation.methods: mtp cannot run here: the model has no MTP layers"):
        _resolve({"methods": ["mtp"]})
    with pytest.raises(ConfigError, match=r"eagle cannot run here: give its path as speculation.eagle_head"):
        _resolve({"methods": ["ngram", "eagle"]})
    with pytest.raises(ConfigError, match="unknown method 'medusa2'; give some of ngram, suffix, mtp"):
        _resolve({"methods": ["medusa2"]})


def test_mtp_is_searched_for_a_model_that_declares_mtp_layers(tmp_path):
    model = replace(MODEL, source=_model_dir(tmp_path / "m", num_nextn_predict_layers=1))
    choices, _ = _resolve({"num_speculative_tokens": [1]}, model)
    assert '{"method": "mtp", "num_speculative_tokens": 1}' in choices
    assert not speculation.has_mtp_layers(_model_dir(tmp_path / "plain"))


@pytest.mark.parametrize("yaml_text, expected", [
    ("space: {max-num-seqs: {}}\nspeculation: {num_speculative_tokens: [3]}\n",
     "space has no speculative-config; add `speculative-config: {}` to space"),
    ("space: {speculative-config: {choices: ['off']}}\nspeculation: {num_speculative_tokens: [3]}\n",
     "space.speculative-config gives choices and a `speculation:` section builds them; keep one"),
])
def test_a_section_without_the_knob_or_beside_its_choices_is_one_line(tmp_path, yaml_text, expected):
    path = tmp_path / "c.yaml"
    path.write_text("model: {path: tiny}\n" + yaml_text)
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert expected in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("schedule, expected", [
    ([[2, 8, 4]], "the first range must start at batch size 1"),
    ([[1, 8, 4], [8, 16, 2]], "the ranges overlap at batch size 8"),
    ([[1, 8, -1]], "row [1, 8, -1]: give 1 <= start <= end and tokens >= 0"),
    ([[1, 8]], "give [start, end, tokens] rows of whole numbers"),
    ("1-8:4", "give [start, end, tokens] rows of whole numbers"),
])
def test_a_per_batch_size_schedule_vllm_would_refuse_is_one_line(schedule, expected):
    text = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                       "num_speculative_tokens_per_batch_size": schedule})
    with pytest.raises(ConfigError) as exc:
        speculation.check(text, "space.speculative-config")
    assert expected in str(exc.value) and "\n" not in str(exc.value)
