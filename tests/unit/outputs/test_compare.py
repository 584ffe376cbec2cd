"""outputs/compare.py: token-by-token comparison of greedy outputs, the flip rate and margins, Output
storage, and the parse of a /v1/completions response body.

The recorded body below was produced by vLLM 0.32's own serializer
(`OpenAIServingCompletion._create_completion_logprobs` + `CompletionResponse.model_dump_json`,
with return_tokens_as_token_ids and logprobs=5), not typed by hand.
"""

import json
import socket

import pytest

from optimizer.outputs.compare import (
    DEFAULT_PROMPTS,
    Flip,
    Output,
    collect,
    compare,
    exceeds,
    parse_completion,
    request_body,
)

RECORDED = json.loads(
    '{"id":"cmpl-5f0c2d1e9a7b4c3d","object":"text_completion","created":1760000000,"model":"Qwen/Qwen3-0.6B",'
    '"choices":[{"index":0,"text":" The capital of Australia","logprobs":{"text_offset":[0,12,25,37],'
    '"token_logprobs":[-0.0123,-0.6914,-0.0009,-0.2611],'
    '"tokens":["token_id:578","token_id:6864","token_id:315","token_id:8494"],'
    '"top_logprobs":[{"token_id:578":-0.0123,"token_id:791":-4.8125,"token_id:1102":-6.0625,'
    '"token_id:362":-6.4375,"token_id:32":-7.1875},{"token_id:6864":-0.6914,"token_id:3363":-0.8789,'
    '"token_id:1176":-3.0039,"token_id:7344":-4.2539,"token_id:1455":-5.1289},{"token_id:315":-0.0009,'
    '"token_id:374":-7.6259,"token_id:11":-8.5009,"token_id:13":-9.1259,"token_id:449":-10.0009},'
    '{"token_id:8494":-0.2611,"token_id:29438":-1.6361,"token_id:279":-5.3861,"token_id:264":-6.2611,'
    '"token_id:578":-7.0111}]},"finish_reason":"length","stop_reason":null,"token_ids":null,'
    '"prompt_logprobs":null,"prompt_token_ids":null,"routed_experts":null}],"service_tier":null,'
    '"system_fingerprint":null,"usage":{"prompt_tokens":18,"total_tokens":22,"completion_tokens":4,'
    '"prompt_tokens_details":null,"completion_tokens_details":null},"kv_transfer_params":null,'
    '"ec_transfer_params":null,"metrics":null}')


def tok(i: int) -> str:
    return f"token_id:{i}"


def out(index, ids, alts=None, logprob=-0.1):
    """An Output choosing `ids` with `logprob` each; alts maps a position to extra {id: logprob}
    entries of that position's top-k (the chosen token is always in its own top-k)."""
    alts = alts or {}
    top = tuple({tok(t): logprob, **{tok(a): lp for a, lp in alts.get(p, {}).items()}} for p, t in enumerate(ids))
    return Output(index, tuple(tok(t) for t in ids), (logprob,) * len(ids), top)


def run(*seqs):
    return [out(i, ids) for i, ids in enumerate(seqs)]


# --- compare -----------------------------------------------------------------------------------

def test_identical_runs_have_no_flips_and_compare_every_token():
    ref = run([1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12])
    c = compare(ref, run([1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]))
    assert (c.prompts, c.compared_tokens, c.flips) == (3, 12, ())
    assert c.first_divergence == (None, None, None)
    assert c.flip_rate == 0.0 and c.prompts_diverged == 0
    assert not exceeds(c, 0.0)


def test_one_flip_stops_that_prompt_at_the_flip():
    # prompt 1 flips at position 2: positions 0, 1, 2 are compared; 3..7 differ too but have a
    # different prefix and must not count (neither as flips nor as compared tokens)
    ref = run([1] * 8, [2, 3, 4, 5, 6, 7, 8, 9])
    cand = run([1] * 8, [2, 3, 40, 50, 60, 70, 80, 90])
    c = compare(ref, cand)
    assert c.compared_tokens == 8 + 3
    assert c.first_divergence == (None, 2)
    assert c.flips == (Flip(1, 2, tok(4), tok(40), None, None),)
    assert c.flip_rate == pytest.approx(1 / 11)
    assert c.prompts_diverged == 1


def test_flip_at_the_first_token_compares_one_position():
    c = compare(run([1, 2, 3]), run([7, 2, 3]))
    assert (c.compared_tokens, c.first_divergence, c.flip_rate) == (1, (0,), 1.0)


def test_margin_is_taken_from_the_reference_top_k():
    # reference chose 4 at -0.10 with 40 at -0.35 in its top-k; the candidate chose 40 at -0.20
    # with 4 at -0.25 in its own top-k
    ref = [out(0, [1, 4, 5], alts={1: {40: -0.35, 41: -2.0}}, logprob=-0.10)]
    cand = [out(0, [1, 40, 5], alts={1: {4: -0.25}}, logprob=-0.20)]
    (flip,) = compare(ref, cand).flips
    assert flip.margin == pytest.approx(0.25)
    assert flip.candidate_margin == pytest.approx(0.05)


def test_candidate_token_beyond_reference_top_k_has_no_margin():
    ref = [out(0, [1, 4], alts={1: {41: -1.0, 42: -2.0}})]
    cand = [out(0, [1, 40], alts={1: {4: -0.5}})]
    (flip,) = compare(ref, cand).flips
    assert flip.margin is None
    assert flip.candidate_margin == pytest.approx(0.4)


def test_prompts_are_matched_by_index_not_list_order():
    ref = run([1, 2], [3, 4])
    cand = [out(1, [3, 9]), out(0, [1, 2])]
    c = compare(ref, cand)
    assert c.first_divergence == (None, 1)
    assert c.flips[0].prompt == 1


def test_unequal_lengths_compare_the_common_prefix():
    c = compare(run([1, 2, 3, 4]), run([1, 2]))
    assert (c.compared_tokens, c.first_divergence, c.flips) == (2, (None,), ())


@pytest.mark.parametrize("cand_indices", [[0, 1], [0, 2, 3], [0, 1, 2, 3]])
def test_runs_over_different_prompts_are_rejected(cand_indices):
    ref = [out(i, [1]) for i in (0, 1, 2)]
    with pytest.raises(ValueError, match="different prompts"):
        compare(ref, [out(i, [1]) for i in cand_indices])


def test_a_prompt_twice_in_one_run_is_rejected():
    with pytest.raises(ValueError, match="twice"):
        compare([out(0, [1]), out(1, [1])], [out(0, [1]), out(0, [1])])


def test_exceeds_is_strictly_above_the_maximum():
    c = compare(run([1, 2, 3, 4]), run([1, 2, 3, 9]))  # 1 flip in 4 tokens
    assert not exceeds(c, 0.25)
    assert exceeds(c, 0.2)


# --- summary and storage -----------------------------------------------------------------------

def test_summary_names_rate_counts_positions_and_margins():
    ref = [out(0, [1] * 12), out(1, [1, 2, 3, 4, 5, 6], alts={4: {50: -0.3}}),
           out(2, [1, 2, 3], alts={1: {20: -0.11}}), out(3, [7, 7, 7, 7])]
    cand = [out(0, [1] * 12), out(1, [1, 2, 3, 4, 50, 6]), out(2, [1, 20, 3]), out(3, [7, 7, 7, 8])]
    c = compare(ref, cand)
    assert c.compared_tokens == 12 + 5 + 2 + 4
    assert c.summary() == ("top-1 flip rate 0.130 (3 of 23 tokens; 3 of 4 prompts diverge, first at tokens 1, 3, 4; "
                           "margins 0.01-0.20 nats, 1 beyond top-k)")


def test_summary_without_flips():
    summary = compare(run([1, 2]), run([1, 2])).summary()
    assert summary == "top-1 flip rate 0.000 (0 of 2 tokens; 0 of 1 prompts diverge)"


def test_output_json_round_trip():
    o = out(3, [5, 6, 7], alts={0: {8: -1.5}, 2: {9: -0.25}}, logprob=-0.125)
    back = Output.from_dict(json.loads(json.dumps(o.to_dict())))
    assert back == o
    assert isinstance(back.tokens, tuple) and isinstance(back.top, tuple)


def test_output_with_unequal_fields_is_rejected():
    with pytest.raises(ValueError, match="prompt 2"):
        Output(2, (tok(1), tok(2)), (-0.1,), ({}, {}))


def test_comparison_to_dict_is_json_and_complete():
    c = compare([out(0, [1, 4], alts={1: {40: -0.3}})], [out(0, [1, 40])])
    d = json.loads(json.dumps(c.to_dict()))
    assert d["compared_tokens"] == 2 and d["flip_rate"] == 0.5 and d["first_divergence"] == [1]
    assert d["flips"] == [{"prompt": 0, "position": 1, "reference": tok(4), "candidate": tok(40),
                           "margin": pytest.approx(0.2), "candidate_margin": None}]


# --- the request and the response ---------------------------------------------------------------

def test_request_body_is_greedy_with_token_id_logprobs():
    assert request_body("m", "Hello", 32, 5) == {
        "model": "m", "prompt": "Hello", "max_tokens": 32, "temperature": 0, "logprobs": 5,
        "ignore_eos": True, "return_tokens_as_token_ids": True, "seed": 0}


def test_parse_recorded_vllm_response():
    o = parse_completion(7, RECORDED)
    assert o.prompt_index == 7
    assert o.tokens == (tok(578), tok(6864), tok(315), tok(8494))
    assert o.logprobs == (-0.0123, -0.6914, -0.0009, -0.2611)
    assert len(o.top) == 4 and all(len(t) == 5 for t in o.top)
    assert o.top[1] == {tok(6864): -0.6914, tok(3363): -0.8789, tok(1176): -3.0039, tok(7344): -4.2539,
                        tok(1455): -5.1289}
    # a parsed output feeds compare: a candidate choosing the runner-up at position 1
    cand = Output(7, (tok(578), tok(3363)) + o.tokens[2:], o.logprobs, o.top)
    (flip,) = compare([o], [cand]).flips
    assert (flip.position, flip.margin) == (1, pytest.approx(0.1875))


@pytest.mark.parametrize("body", [
    {"object": "error", "message": "bad", "code": 400},
    {"choices": []},
    {"choices": [{"index": 0, "text": "x", "logprobs": None}]},
])
def test_parse_without_logprobs_names_the_prompt(body):
    with pytest.raises(ValueError, match="prompt 4"):
        parse_completion(4, body)


def test_collect_unreachable_server_names_the_prompt():
    with socket.socket() as s:  # a port nothing listens on once the socket closes
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RuntimeError, match=r"^prompt 0: http://127\.0\.0\.1:\d+/v1/completions: "):
        collect(f"http://127.0.0.1:{port}/", "m", ["Hi"], timeout=5)


def test_default_prompts_are_varied_and_short():
    assert 10 <= len(DEFAULT_PROMPTS) <= 14
    assert len(set(DEFAULT_PROMPTS)) == len(DEFAULT_PROMPTS)
    assert all(0 < len(p.split()) < 60 for p in DEFAULT_PROMPTS)
