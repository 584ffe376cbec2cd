"""The agent, batch, rag and burst scenarios build what their specs describe; bad values are refused."""

import math
import statistics

import pytest

from optimizer.config.schema import build_config
from optimizer.config.workload_spec import AgentSpec, BatchSpec, BurstSpec, RagSpec
from optimizer.errors import ConfigError
from optimizer.workload import Vocabulary, build_workload
from optimizer.workload.stats import PREFIX_PROBE, shared_prefix_share

VOCAB = Vocabulary(4096)


def agent(**kw):
    base = dict(seed=0, sessions=40, turns=(4, 6), system_tokens=256, user_input=(16, 64), tool_result=(16, 4096),
                output=(8, 32), think_s=(0.1, 0.5), max_context=65536,  # 320 + 5 * (32 + 4096) never hits it
                arrival={"process": "poisson", "rate": 2.0})
    return build_workload(AgentSpec(**{**base, **kw}), VOCAB)


def chains(w):
    """Session chains: each root followed by the requests that wait on it, in order."""
    by_after = {}
    for r in w.requests:
        if r.after is not None:
            assert r.after not in by_after, f"two requests wait on {r.after}: a tree, not a chain"
            by_after[r.after] = r
    out = []
    for root in (r for r in w.requests if r.after is None):
        chain = [root]
        while chain[-1].id in by_after:
            chain.append(by_after[chain[-1].id])
        out.append(chain)
    return out


def test_agent_turns_form_one_chain_per_session_in_send_order():
    w = agent()
    cs = chains(w)
    assert len(cs) == 40
    assert sum(len(c) for c in cs) == len(w.requests)  # every request is on exactly one chain
    assert all(4 <= len(c) <= 6 for c in cs)  # turns (4, 6), never cut: max_context is out of reach
    position = {r.id: i for i, r in enumerate(w.requests)}
    assert all(position[r.after] < position[r.id] for r in w.requests if r.after)
    assert w.concurrency is None


def test_agent_context_grows_by_reply_and_tool_result():
    w = agent()
    tools = []
    for chain in chains(w):
        for prev, nxt in zip(chain, chain[1:]):
            p, n = prev.prompt_token_ids, nxt.prompt_token_ids
            assert n[:len(p)] == p  # the whole previous prompt, then more
            tools.append(len(n) - len(p) - prev.max_tokens)  # previous reply, then the tool result
    assert all(16 <= t <= 4096 for t in tools)
    assert max(tools) / min(tools) >= 100  # tens to thousands of tokens
    # log-uniform on [16, 4096]: the median sits near the geometric mean, 256 (~160 draws: the
    # log-median's sd is ~0.2, allow 3 sd); uniform draws would put it near 2056
    assert abs(math.log(statistics.median(tools)) - math.log(math.sqrt(16 * 4096))) < 0.6
    assert sum(t < 64 for t in tools) > 0 and sum(t > 1024 for t in tools) > 0


def test_agent_sessions_share_the_tool_definitions_and_nothing_else():
    w = agent()
    roots = [c[0] for c in chains(w)]
    system = roots[0].prompt_token_ids[:256]
    assert all(r.prompt_token_ids[:256] == system for r in roots)
    user_heads = {r.prompt_token_ids[256:256 + 16] for r in roots}
    assert len(user_heads) == len(roots)  # the user messages differ
    assert not any(r.prompt_token_ids[:256] == system for r in w.warmup)  # warm-up has its own tools
    assert agent(seed=1).requests[0].prompt_token_ids[:256] != system


def test_agent_think_time_and_start_offsets():
    w = agent()
    follow = [r.offset_s for r in w.requests if r.after is not None]
    assert follow and all(0.1 <= o <= 0.5 for o in follow)
    assert max(follow) - min(follow) > 0.2  # drawn, not fixed
    starts = [r.offset_s for r in w.requests if r.after is None]
    assert all(b > a for a, b in zip(starts, starts[1:]))  # the session starts follow the arrival process


def test_agent_never_exceeds_max_context():
    w = agent(max_context=4096, tool_result=(16, 16384))
    assert all(r.total_tokens <= 4096 for r in w.requests + w.warmup)
    assert any(len(c) < 4 for c in chains(w))  # some sessions were cut short by the limit


def test_agent_closed_loop_starts_every_session_at_once():
    w = agent(arrival={"process": "closed", "concurrency": 3})
    assert w.concurrency == 3
    assert all(r.offset_s == 0.0 for r in w.requests if r.after is None)


@pytest.mark.parametrize("concurrency, expected", [(None, 30), (7, 7)])
def test_batch_queues_everything_at_zero(concurrency, expected):
    w = build_workload(BatchSpec(requests=30, input=(8, 64), output=(4, 16), concurrency=concurrency), VOCAB)
    assert w.concurrency == expected and len(w.requests) == 30
    assert {r.offset_s for r in w.requests + w.warmup} == {0.0}
    assert all(8 <= len(r.prompt_token_ids) <= 64 and 4 <= r.max_tokens <= 16 for r in w.requests)


def rag(**kw):
    base = dict(seed=0, requests=400, documents=4, prefix_tokens=(256, 512), prefix_share=0.7,
                question=(8, 32), output=(4, 16))
    return build_workload(RagSpec(**{**base, **kw}), VOCAB)


def test_rag_prefix_share_of_requests_start_with_a_shared_document():
    w = rag()
    assert shared_prefix_share(w) == pytest.approx(0.7, abs=0.07)  # binomial sd 0.023
    heads = [r.prompt_token_ids[:PREFIX_PROBE] for r in w.requests]
    shared = {h for h in heads if heads.count(h) > 1}
    assert len(shared) == 4  # exactly `documents` shared prefixes
    assert rag(prefix_share=0.0).requests and shared_prefix_share(rag(prefix_share=0.0)) == 0.0
    assert shared_prefix_share(rag(prefix_share=1.0)) == 1.0


def test_rag_warmup_shares_no_prefix_with_the_measured_set():
    w = rag(warmup_requests=20, prefix_share=1.0)
    measured = {r.prompt_token_ids[:PREFIX_PROBE] for r in w.requests}
    warm = [r.prompt_token_ids[:PREFIX_PROBE] for r in w.warmup]
    assert len(set(warm)) < len(warm)  # the warm-up shares its own documents...
    assert not measured & set(warm)  # ...never the measured ones


def test_burst_spike_windows_are_denser_than_the_base():
    s = BurstSpec(seed=0, requests=600, input=(8, 16), output=(4, 8), base_rate=1.0, spike_rate=12.0,
                  spike_every_s=20.0, spike_duration_s=4.0, first_spike_s=5.0)
    offs = [r.offset_s for r in build_workload(s, VOCAB).requests]
    assert all(b >= a for a, b in zip(offs, offs[1:]))
    periods = math.floor((offs[-1] - 5.0) / 20.0)
    assert periods >= 5
    horizon = [t for t in offs if t < 5.0 + periods * 20.0]
    inside = sum(1 for t in horizon if t >= 5.0 and (t - 5.0) % 20.0 < 4.0)
    spike_rate = inside / (periods * 4.0)
    base_rate = (len(horizon) - inside) / (5.0 + periods * 16.0)
    assert spike_rate == pytest.approx(12.0, rel=0.2) and base_rate == pytest.approx(1.0, rel=0.3)
    assert spike_rate > 5 * base_rate


SPECS = {
    "agent": lambda seed: AgentSpec(seed=seed, sessions=4, system_tokens=32, tool_result=(8, 256)),
    "batch": lambda seed: BatchSpec(seed=seed, requests=8),
    "rag": lambda seed: RagSpec(seed=seed, requests=8, prefix_tokens=(128, 256)),
    "burst": lambda seed: BurstSpec(seed=seed, requests=8),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_same_seed_same_workload_other_seed_other_workload(name):
    a, b, c = (build_workload(SPECS[name](s), VOCAB) for s in (3, 3, 4))
    assert a == b and a.content_hash() == b.content_hash() and a.name == name
    assert c.content_hash() != a.content_hash()


@pytest.mark.parametrize("workload, field, words", [
    ({"scenario": "burst", "spike_every_s": 10, "spike_duration_s": 10}, "workload", "spike_duration_s"),
    ({"scenario": "burst", "base_rate": 0}, "workload.base_rate", "greater than 0"),
    ({"scenario": "agent", "max_context": 512}, "workload", "max_context"),
    ({"scenario": "agent", "think_s": [2.0, 1.0]}, "workload", "think_s"),
    ({"scenario": "agent", "tool_result": [0, 10]}, "workload", "tool_result"),
    ({"scenario": "rag", "prefix_share": 1.5}, "workload.prefix_share", "less than or equal to 1"),
    ({"scenario": "rag", "arrival": {"process": "trace"}}, "workload", "needs scenario 'trace'"),
    ({"scenario": "rag", "sede": 1}, "workload.sede", "unknown key"),
    ({"scenario": "batch", "arrival": {"process": "poisson", "rate": 1}}, "workload.arrival", "unknown key"),
    ({"scenario": "agent", "requests": 10}, "workload.requests", "unknown key"),
    ({"scenario": "podcast"}, "workload", "'chat', 'batch', 'rag', 'burst', 'agent', 'trace'"),
])
def test_bad_scenario_values_are_config_errors_naming_the_field(workload, field, words):
    with pytest.raises(ConfigError) as err:
        build_config({"model": {"path": "/m"}, "workload": workload})
    msg = str(err.value)
    assert f"field '{field}'" in msg and words in msg, msg
