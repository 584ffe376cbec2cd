"""The `text` scenario (workload/text/): real passages and questions
through the model's own tokenizer and chat template; copy-heavy requests as long as their passage,
open questions as long as `output` says; the warm-up on text no measured request uses."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError
from tokenizers import Tokenizer

from optimizer.config.workload_spec import TextSpec
from optimizer.engine.tiny_model import write_tiny_model
from optimizer.errors import ConfigError
from optimizer.workload import build_workload
from optimizer.workload.text import corpus as text_corpus
from optimizer.workload.text.chat_template import load
from optimizer.workload.tokens import Vocabulary

# SmolLM2-135M-Instruct's template, as its chat_template.jinja holds it (ChatML with a default system turn).
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "m")


@pytest.fixture(scope="module")
def templated(tmp_path_factory, tiny):
    d = tmp_path_factory.mktemp("chat") / "m"
    d.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (d / name).write_bytes((tiny / name).read_bytes())
    (d / "chat_template.jinja").write_text(SMOLLM2_TEMPLATE)
    return d


def _vocab(model_dir) -> Vocabulary:
    return Vocabulary(json.loads((model_dir / "config.json").read_text())["vocab_size"], str(model_dir), 4096)


def _decode(model_dir, ids) -> str:
    return Tokenizer.from_file(str(model_dir / "tokenizer.json")).decode(list(ids))


def test_the_template_frames_one_user_turn_as_vllms_chat_endpoint_would(templated):
    assert load(templated)("Hi there.") == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi there.<|im_end|>\n<|im_start|>assistant\n")
    # tokenizer_config.json's chat_template is read the same way when there is no .jinja file
    (templated.parent / "cfg").mkdir()
    (templated.parent / "cfg" / "tokenizer_config.json").write_text(json.dumps({"chat_template": SMOLLM2_TEMPLATE}))
    assert load(templated.parent / "cfg")("Hi there.") == load(templated)("Hi there.")
    assert load(templated.parent) is None  # no template at all


def test_copy_heavy_requests_quote_a_passage_and_are_as_long_as_it(templated):
    vocab = _vocab(templated)
    wl = build_workload(TextSpec(copy_share=1.0, requests=12), vocab)
    assert wl.name == "text" and len(wl.requests) == 12 and not wl.notes
    for r in wl.requests:
        text = _decode(templated, r.prompt_token_ids)
        passage = next(p for p in text_corpus.PASSAGES if p in text)  # the passage, whole, in the prompt
        assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
        assert r.max_tokens == len(vocab.encode(passage))
    assert "100% quoting one of 14 passages back" in wl.description


def test_open_questions_ask_about_a_topic_and_draw_their_length(templated):
    wl = build_workload(TextSpec(copy_share=0.0, requests=12, output=(20, 30)), _vocab(templated))
    for r in wl.requests:
        text = _decode(templated, r.prompt_token_ids)
        assert any(t in text for t in text_corpus.TOPICS) and not any(p in text for p in text_corpus.PASSAGES)
        assert 20 <= r.max_tokens <= 30


def test_the_warm_up_never_shares_a_passage_or_topic_with_the_measured_set(templated):
    wl = build_workload(TextSpec(copy_share=0.5, requests=40, warmup_requests=6), _vocab(templated))
    kept = text_corpus.PASSAGES[-text_corpus.WARMUP_KEPT:] + text_corpus.TOPICS[-text_corpus.WARMUP_KEPT:]
    measured = [_decode(templated, r.prompt_token_ids) for r in wl.requests]
    warm = [_decode(templated, r.prompt_token_ids) for r in wl.warmup]
    assert all(any(k in w for k in kept) for w in warm)
    assert not any(k in m for k in kept for m in measured)
    copies = sum(any(p in m for p in text_corpus.PASSAGES) for m in measured)
    assert 10 <= copies <= 30  # about half of 40


def test_it_is_seeded_and_a_model_without_a_template_gets_the_bare_text_said_in_its_notes(tiny, templated):
    spec = TextSpec(copy_share=0.5, requests=8, seed=3)
    assert build_workload(spec, _vocab(templated)).content_hash() == build_workload(spec, _vocab(templated)).content_hash()
    assert build_workload(spec, _vocab(templated)).content_hash() != \
        build_workload(TextSpec(copy_share=0.5, requests=8, seed=4), _vocab(templated)).content_hash()
    bare = build_workload(spec, _vocab(tiny))
    assert bare.notes == ("no chat template read (the model directory has none, or the model is a Hub id): each "
                          "prompt is the bare request text",)
    assert "<|im_start|>" not in _decode(tiny, bare.requests[0].prompt_token_ids)


def test_without_a_tokenizer_it_is_one_line_and_a_share_outside_0_1_is_refused():
    with pytest.raises(ConfigError, match="workload scenario 'text': the model's tokenizer is unknown"):
        build_workload(TextSpec(), Vocabulary(4096))
    with pytest.raises(ValidationError, match="copy_share"):
        TextSpec(copy_share=1.5)


def test_templates_with_break_and_raise_exception_work_as_in_vllm_and_a_refusal_is_one_line(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system turn') }}{% endif %}"
        "[{{ m['content'] }}]{% break %}{% endfor %}{% if add_generation_prompt %}>{% endif %}")
    assert load(d)("hello") == "[hello]>"
    (d / "chat_template.jinja").write_text("{{ raise_exception('this model takes no user turn') }}")
    with pytest.raises(ConfigError) as exc:
        load(d)("hello")
    assert "its chat template refused one user message (this model takes no user turn)" in str(exc.value)
    assert "\n" not in str(exc.value)
    (d / "chat_template.jinja").write_text("{% for m in messages %}")
    with pytest.raises(ConfigError, match="its chat template does not parse"):
        load(d)
