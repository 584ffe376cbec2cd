"""The output check with speculative decoding (outputs/speculation_check.py, outputs/gate.py): a
speculating trial is compared with the baseline at equal batch sizes, and the flips batching makes
without any speculation are reported apart; the gate holds what speculation adds to its limit."""

from __future__ import annotations

import json

import optuna

from optimizer.config.schema import build_config
from optimizer.outputs import gate as outputcheck
from optimizer.outputs import speculation_check
from optimizer.outputs.compare import Output
from optimizer.trial.spec import TrialResult

NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4, "prompt_lookup_min": 2})


def _out(i, tokens, batch=1):
    return Output(i, tuple(f"token_id:{t}" for t in tokens), tuple(-0.1 for _ in tokens),
                  tuple({f"token_id:{t}": -0.1, "token_id:999": -0.4} for t in tokens), batch)


# Four prompts of 4 tokens, alone and at batch 4. Batching alone (the baseline at batch 4) flips
# prompt 3 at its last token; speculation, at batch 4, flips prompt 0 at token 1 too.
ALONE = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]]
BATCHED = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 99]]
SPEC_BATCHED = [[1, 77, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 99]]


def _run(alone, batched, batch=4):
    return [_out(i, t) for i, t in enumerate(alone)] + [_out(i, t, batch) for i, t in enumerate(batched)]


def test_the_flips_speculation_adds_are_told_apart_from_the_flips_of_batching():
    found = speculation_check.check(_run(ALONE, BATCHED), _run(ALONE, SPEC_BATCHED))
    assert found.batch == 4
    assert found.alone.flip_rate == 0.0  # alone, the speculating server answers as the baseline does
    assert (found.batched.flips[0].prompt, found.batched.flips[0].position) == (0, 1)
    assert found.batched.flip_rate == 1 / (2 + 4 + 4 + 4)  # prompt 0 compared up to its flip at token 1
    assert [(f.prompt, f.position) for f in found.batching.flips] == [(3, 3)]  # no speculation anywhere
    assert found.flip_rate == found.batched.flip_rate
    assert found.summary() == ("speculation adds a top-1 flip rate of 0.000 alone and 0.071 at batch 4 (vs the "
                               "baseline at the same batch size: 0 and 1 of 4 prompts diverge); batching alone "
                               "flips 0.062 without speculation (1 prompt, the baseline alone vs at batch 4)")
    assert json.loads(json.dumps(found.to_dict()))["batching"]["flips"][0]["prompt"] == 3


def test_without_batched_answers_on_either_side_there_is_no_speculation_check():
    alone_only = [_out(i, t) for i, t in enumerate(ALONE)]
    assert speculation_check.check(alone_only, _run(ALONE, BATCHED)) is None
    assert speculation_check.check(_run(ALONE, BATCHED), alone_only) is None


def _cfg(**regression):
    return build_config({"model": {"path": "m"}, "space": {"speculative-config": {}},
                         "regression": {"enabled": True, **regression}})


def _told(study, cfg, outputs, speculative_config, baseline=False):
    study.enqueue_trial({"speculative-config": speculative_config})
    trial = study.ask()
    trial.suggest_categorical("speculative-config", ("off", NGRAM))
    if baseline:
        trial.set_user_attr("baseline", True)
    result = outputcheck.gate(study, trial, TrialResult(trial.number, None, metrics={"x": 1.0},
                                                         outputs=tuple(o.to_dict() for o in outputs)), cfg)
    study.tell(trial, 1.0)
    return result, study.trials[-1].user_attrs["regression"]


def test_a_study_that_searches_speculation_answers_batched_too():
    prompts, _, _, batch = outputcheck.trial_spec_part(_cfg(batch=6))
    assert batch == 6 and len(prompts) == 8
    plain = build_config({"model": {"path": "m"}, "regression": {"enabled": True}})
    assert outputcheck.trial_spec_part(plain)[3] == 1  # no speculation searched: alone only, as before


def test_the_gate_holds_what_speculation_adds_not_what_batching_flips():
    study = optuna.create_study()
    cfg = _cfg(max_flip_rate=0.07, batch=4)
    _told(study, cfg, _run(ALONE, BATCHED), "off", baseline=True)
    # Batching's own flip (prompt 3) is on both sides at batch 4: speculation adds nothing, it passes.
    result, record = _told(study, cfg, _run(ALONE, BATCHED), NGRAM)
    assert result.failure is None and record["speculation"]["flip_rate"] == 0.0
    assert record["speculation"]["batching"]["flip_rate"] > 0
    # Speculation's own flip at batch 4 (0.071) is above 0.07: output_changed, the summary says which.
    result, record = _told(study, cfg, _run(ALONE, SPEC_BATCHED), NGRAM)
    assert result.failure.kind == "output_changed"
    assert "speculation adds a top-1 flip rate of 0.000 alone and 0.071 at batch 4" in result.failure.evidence
    assert record["summary"].startswith("speculation adds")
    # The same answers from a trial that does not speculate: the usual check (alone), which passes.
    result, record = _told(study, cfg, _run(ALONE, SPEC_BATCHED), "off")
    assert result.failure is None and "speculation" not in record and record["flip_rate"] == 0.0


def test_the_record_keeps_the_rate_the_gate_held_as_its_flip_rate():
    study = optuna.create_study()
    cfg = _cfg(max_flip_rate=0.5, batch=4)
    _told(study, cfg, _run(ALONE, BATCHED), "off", baseline=True)
    _, record = _told(study, cfg, _run(ALONE, SPEC_BATCHED), NGRAM)
    assert record["flip_rate"] == record["speculation"]["flip_rate"] > 0  # what the diagnosis reads
    assert record["alone_flip_rate"] == 0.0


def test_fewer_prompts_than_the_batch_are_sent_and_recorded_as_they_went(monkeypatch):
    from optimizer.outputs import compare

    sent = []
    monkeypatch.setattr(compare, "collect", lambda url, model, prompts, max_tokens=32, top_k=5, timeout=120,
                        batch=1: sent.append(min(batch, len(prompts))) or [])
    compare.collect_both("http://x", "m", ["a", "b"], 4, 1, 8)
    compare.collect_both("http://x", "m", ["a"], 4, 1, 8)
    assert sent == [1, 2, 1]  # alone, then 2 at a time; one prompt: alone only
