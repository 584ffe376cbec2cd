"""config/kv_fit.py with a draft model: a speculative config that loads a local draft (draft_model,
EAGLE heads) adds its weights to the non-KV memory and its layers' KV to every token, as vLLM
takes the draft's KV blocks from the same budget; n-gram, off and a Hub id add nothing."""

from __future__ import annotations

import json

from optimizer.config.kv_fit import CPU_BLOCK_SIZE, Calibration, draft_model_info, estimate
from optimizer.engine.device import GIB
from tests.unit.config.test_kv_fit import TINY, cpu

NODE = cpu(16 * GIB)
# A draft a quarter of the tiny target: 2 layers, 4 KV heads of 64 -> 2 x 2 x 4 x 64 x 2 bytes = 2 KiB per token.
DRAFT_CONFIG = {"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "hidden_size": 512,
                "intermediate_size": 1024, "vocab_size": 3648, "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}


def _draft(tmp_path) -> str:
    d = tmp_path / "draft"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(DRAFT_CONFIG))
    return str(d)


def _params(spec: str | None) -> dict:
    out = {"gpu-memory-utilization": 0.2, "max-model-len": 4096}
    return {**out, "speculative-config": spec} if spec is not None else out


def test_a_local_draft_model_costs_its_weights_and_its_kv_per_token(tmp_path):
    draft = _draft(tmp_path)
    spec = json.dumps({"method": "draft_model", "model": draft, "num_speculative_tokens": 3})
    info = draft_model_info(spec)
    assert (info.layers, info.kv_heads, info.kv_bytes_per_token()) == (2, 4, 2048)
    alone, with_draft = estimate(TINY, NODE, _params(None)), estimate(TINY, NODE, _params(spec))
    assert with_draft.non_kv_bytes - alone.non_kv_bytes == info.weight_bytes()
    per_token = TINY.kv_bytes_per_token() + 2048
    block = CPU_BLOCK_SIZE * per_token
    assert with_draft.capacity_tokens == (with_draft.budget_bytes // block) * CPU_BLOCK_SIZE
    assert with_draft.capacity_tokens < alone.capacity_tokens
    assert f"{per_token / 1024:g} KiB per token" in with_draft.basis


def test_ngram_off_and_a_hub_draft_add_nothing():
    base = estimate(TINY, NODE, _params(None))
    for spec in ("off", json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}),
                 json.dumps({"method": "draft_model", "model": "org/small-draft", "num_speculative_tokens": 3}),
                 "{not json"):
        assert draft_model_info(spec) is None
        assert estimate(TINY, NODE, _params(spec)).capacity_tokens == base.capacity_tokens


def test_a_calibration_learned_on_a_draft_trial_predicts_that_trial_back(tmp_path):
    spec = json.dumps({"method": "draft_model", "model": _draft(tmp_path), "num_speculative_tokens": 3})
    params = _params(spec)
    truth = estimate(TINY, NODE, params)
    log = f"INFO [kv_cache_utils.py] CPU KV cache size: {truth.capacity_tokens:,} tokens\n"
    learned = Calibration.from_log(TINY, NODE, params, log)
    again = estimate(TINY, NODE, params, learned)
    assert again.capacity_tokens == truth.capacity_tokens
    # the overhead it keeps excludes the draft's weights: a trial without the draft is not charged for them
    assert estimate(TINY, NODE, _params(None), learned).non_kv_bytes < again.non_kv_bytes
