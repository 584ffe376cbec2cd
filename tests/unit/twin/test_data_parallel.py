"""twin/peak/data_parallel.py and twin/peak/topologies.py: DP engines of one configuration behind vLLM's balancer
(each request to the engine with the fewest in flight, ties in turn), and the data-parallel sizes
`plan` predicts for a study that measured one engine."""

import optuna
import pytest

from optimizer.measure.metrics import summarize
from optimizer.twin.peak.data_parallel import DataParallel, least_in_flight
from optimizer.twin.step_cost import LinearStepCost
from optimizer.twin.peak.topologies import tiled
from optimizer.twin.prediction import BAND_ONE_RUN
from optimizer.workload.base import Request
from tests.unit.twin.test_tails import _plan, study  # noqa: F401  (the stored study of two trials)

COST = LinearStepCost((0.006, 0.00003, 0.00002, 0.0011, 0.0002, 0.0001, 0.00003, 0.00002, 0.0002, 0.00005), 0.004)


def _req(i: int, prompt: int, out: int, at: float, after: str | None = None) -> Request:
    return Request(f"r{i}", tuple(range(100 + i * 1000, 100 + i * 1000 + prompt)), out, at, after)


def test_the_balancer_sends_each_request_to_the_engine_with_fewest_in_flight_ties_in_turn():
    chains = {i: [i] for i in range(5)}
    # r0 runs 0-10 s, r1 0.1-0.5 s: at 1 s engine 1 is free, engine 0 busy; r3 and r4 arrive together at 2 s
    times = {0: (0.0, 10.0), 1: (0.1, 0.5), 2: (1.0, 1.5), 3: (2.0, 3.0), 4: (2.0, 3.0)}
    where = least_in_flight([0, 1, 2, 3, 4], chains, times, 2)
    assert where[0] == 0 and where[1] == 1  # in turn while both are empty
    assert where[2] == 1  # not in turn (engine 0 would be next): engine 0 still runs r0
    assert where[3] == 1  # r2 has finished: none in flight there, r0 on engine 0
    assert where[4] == 0  # one in flight on each: a tie, and this scan starts at engine 0 (the fifth request)
    assert least_in_flight([0, 1, 2], chains, {i: (0.0, 1.0) for i in range(3)}, 3) == {0: 0, 1: 1, 2: 2}


def test_one_engine_is_the_server_itself(twin):
    server = twin("--max-num-seqs", "4")
    reqs = tuple(_req(i, 64 + 8 * i, 16, 0.05 * i) for i in range(10))
    assert DataParallel(server, 1).run(reqs, None, COST).result == server.run(reqs, None, COST).result


def test_a_burst_is_split_evenly_and_each_engine_runs_its_share_alone(twin):
    server = twin("--max-num-seqs", "8")
    burst = tuple(_req(i, 64, 32, 0.0) for i in range(8))
    both = DataParallel(server, 2).run(burst, None, COST)
    assert both.server["running_peak"] == 4 and len(both.result.records) == 8
    alone = summarize(server.run(burst[:4], None, COST).result)  # identical requests: any 4 of them
    merged = summarize(both.result)
    for m in ("ttft_ms_p95", "tpot_ms_p50", "e2el_ms_p95"):
        assert merged[m] == pytest.approx(alone[m], rel=1e-9), m
    assert [r.id for r in both.result.records] == [r.id for r in burst]  # one server's records, in order


def test_a_long_request_steers_the_next_ones_to_the_other_engine(twin):
    """r0 decodes for seconds on one engine; r1 finishes on the other; r2 arrives after r1 finished and
    would go to r0's engine in turn: vLLM's balancer (and the twin) sends it to the empty one, where it
    decodes alone, as fast as r1 did."""
    server = twin("--max-num-seqs", "8")
    reqs = (_req(0, 64, 400, 0.0), _req(1, 64, 16, 0.01), _req(2, 64, 16, 2.0))
    got = {r.id: r for r in DataParallel(server, 2).run(reqs, None, COST).result.records}

    def tpot(r):
        return (r.end_s - r.first_chunk_s) / (r.output_tokens - 1)

    assert got["r0"].end_s > 2.5  # still running when r2 arrives
    assert tpot(got["r2"]) == pytest.approx(tpot(got["r1"]), rel=1e-6)
    in_turn = {r.id: r for r in server.run((reqs[0], reqs[2]), None, COST).result.records}
    assert tpot(in_turn["r2"]) > 1.05 * tpot(got["r2"])  # beside r0, as a balancer in turn would have put it


def test_an_agents_later_turns_stay_on_their_first_turns_engine(twin):
    server = twin("--max-num-seqs", "8")
    reqs = (_req(0, 64, 8, 0.0), _req(1, 64, 8, 0.0), _req(2, 64, 8, 0.1, after="r0"), _req(3, 64, 8, 0.1, after="r2"))
    got = {r.id: r for r in DataParallel(server, 2).run(reqs, None, COST).result.records}
    assert all(r.ok for r in got.values())
    assert got["r2"].sent_s >= got["r0"].end_s + 0.1 - 1e-9 and got["r3"].sent_s >= got["r2"].end_s + 0.1 - 1e-9


def test_a_stream_tiled_n_times_keeps_its_gaps_and_its_turns_and_no_copy_shares_a_prompt():
    stream = (_req(0, 8, 4, 0.0), _req(1, 8, 4, 1.0), _req(2, 8, 4, 0.5, after="r1"), _req(3, 8, 4, 2.0))
    many = tiled(stream, 3, vocab=1050)
    assert len(many) == 12 and len({r.id for r in many}) == 12
    roots = [r.offset_s for r in many if r.after is None]
    assert roots == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]  # each copy one mean gap after the last
    assert [(r.id, r.after, r.offset_s) for r in many if r.after] == [("r2#0", "r1#0", 0.5), ("r2#1", "r1#1", 0.5),
                                                                      ("r2#2", "r1#2", 0.5)]
    assert many[0].prompt_token_ids == stream[0].prompt_token_ids  # copy 0 is the stream itself
    assert many[4].prompt_token_ids == tuple(t + 1 for t in stream[0].prompt_token_ids)
    assert max(t for r in many for t in r.prompt_token_ids) < 1050  # within the vocabulary (wrapped)


def test_n_engines_on_n_copies_carry_at_most_n_times_one_and_copies_never_hit_each_others_cache(twin):
    """A burst of distinct prompts, no SLO: what binds is the engines' own speed, so two engines on two
    copies carry about twice one engine on one, not more; a copy's prompts sharing a prefix still
    hit the cache within it."""
    from optimizer.trial.rate_search import at_rate
    from optimizer.twin.peak.capacity import capacity

    server = twin("--max-num-seqs", "8")
    distinct = tuple(_req(i, 512, 16, 0.05 * i) for i in range(24))
    one = capacity(server, COST, distinct, ()).rate
    many = tiled(distinct, 2, server.model.vocab_size)
    two = capacity(DataParallel(server, 2), COST, many, ())
    assert 1.6 * one <= two.rate <= 2.02 * one, (one, two.rate)
    burst = DataParallel(server, 2).run(at_rate(many, float("inf")), None, COST)
    assert burst.server["prefix_cache_hits"] == 0
    shared = tuple(Request(f"s{i}", tuple(range(300)) + (1000 + i,) * 40, 8, 0.5 * i) for i in range(6))
    assert DataParallel(server, 2).run(tiled(shared, 2, server.model.vocab_size), None,
                                       COST).server["prefix_cache_hits"] > 0


def _dp_rows(lines: list[str]) -> dict[int, str]:
    return {int(x.split()[1].rstrip(":")): x for x in lines if x.startswith("  DP ")}


def test_plan_predicts_the_dp_sizes_not_measured_anchored_on_the_measured_engine(study):  # noqa: F811
    lines = _plan("--peak-qps", "20", "--tokens-per-request", "150", dp="2,4")
    head = next(i for i, x in enumerate(lines) if x.startswith("Predicted topologies (not measured; nothing booted)"))
    rows = _dp_rows(lines)
    assert sorted(rows) == [2, 4] and all(lines.index(r) > head for r in rows.values())
    per_replica = float(next(x for x in lines if x.startswith("Per replica: ")).split(" = ")[1].split()[0]
                        .replace(",", ""))
    for n, row in rows.items():
        ratio = float(row.split(": x", 1)[1].split()[0])
        assert 0.8 * n <= ratio <= 1.25 * n, row  # N engines carry about N times one
        low, high = (float(x) for x in row.split(": x", 1)[1].split()[1].strip("[]").split("-"))
        share = 2 * BAND_ONE_RUN["request_throughput"]  # one engine's band, calibrated on trial 0 alone, doubled
        assert low < ratio < high and high / ratio == pytest.approx(1 + share, rel=0.02), row
        value = float(row.split("one engine, ", 1)[1].split()[0].replace(",", ""))
        assert value == pytest.approx(per_replica * ratio, rel=0.01), row
        assert f"a replica on {n} device(s)" in row and row.endswith("(predicted)")
        assert "TTFT p95 " in row and "TPOT p95 " in row and "knee " in row
    assert ("  (bands: one engine's, doubled, the ratio's its throughput band; the knee has none of its own yet: no "
            "real data-parallel server on a GPU has checked the twin's DP yet)") in lines
    assert any(x.startswith("  OPTIMISTIC here: on a 2-core CPU a real DP 2 server carried ") for x in lines)
    assert lines[-1].startswith("  TP: not predicted on CPU")


def _measured_dp2(tmp_path) -> None:
    """Trial 2: trial 1's configuration measured as DP 2 (its flags and figures, a little slower)."""
    stored = optuna.load_study(study_name="tails", storage=f"sqlite:///{tmp_path / 'trials.db'}")
    one = stored.trials[1]
    attrs = {**one.user_attrs, "vllm_args": [*one.user_attrs["vllm_args"], "--data-parallel-size", "2"]}
    attrs.pop("baseline", None)
    stored.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE, params={}, distributions={},
                                               value=one.value * 0.9, user_attrs=attrs))


def test_a_measured_dp_size_is_not_predicted_and_a_dp_plan_predicts_none(study):  # noqa: F811
    _measured_dp2(study[0])
    lines = _plan("--peak-qps", "20", "--tokens-per-request", "150", dp="2,4")
    assert any(x.startswith("  DP 2: trial 2,") for x in lines)  # measured
    assert sorted(_dp_rows([x for x in lines if "(predicted)" in x])) == [4]
    on_dp = _plan("--peak-qps", "20", "--tokens-per-request", "150", "--trial", "2", dp="2")
    assert any(x.startswith("Predicted topologies: none (the plan rests on 2 devices a replica") for x in on_dp)


def test_plan_predicts_no_dp_size_when_told_none_nor_unasked_on_a_cpu(study):  # noqa: F811
    assert not any(x.startswith(("Predicted topologies", "  DP ", "  TP: ")) for x in
                   _plan("--peak-qps", "20", "--tokens-per-request", "150", dp="none"))
    unasked = _plan("--peak-qps", "20", "--tokens-per-request", "150", dp=None)  # a study on this CPU
    assert not any(x.startswith("  DP ") for x in unasked)
    assert any(x.startswith("Predicted topologies: data parallelism not predicted on a CPU unless asked (--dp 2,4): "
                            "on a 2-core CPU a real DP 2 server carried ") for x in unasked), unasked
    assert unasked[-1].startswith("  TP: not predicted on CPU")


def test_every_size_asked_measured_still_says_where_tp_is_predicted(study):  # noqa: F811
    _measured_dp2(study[0])
    lines = _plan("--peak-qps", "20", "--tokens-per-request", "150", dp="2")
    assert any(x.startswith("Predicted topologies: every data-parallel size asked was measured; TP: not predicted "
                            "on CPU") for x in lines), lines


def test_a_mixture_of_experts_model_gets_no_dp_prediction():
    """vLLM keeps a mixture-of-experts model's DP engines in lockstep (its DPEngineCoreProc): not the
    independent engines the twin steps."""
    from types import SimpleNamespace

    from optimizer.cli.plan import _predicted_topologies
    from optimizer.fleet.capacity import Measurement, plan

    server = SimpleNamespace(config=SimpleNamespace(model_config=SimpleNamespace(is_moe=True)))
    p = plan(Measurement(0, "request_throughput", 10.0, "req/s", 300.0, device="gpu"), 20, 300)
    lines = _predicted_topologies((server, None, (), {}, "gpu"), {}, p, (), set(), None)  # a study that stored nothing
    assert lines[0] == ("Predicted topologies: data parallelism not predicted for a mixture-of-experts model (vLLM "
                        "runs its DP engines in lockstep there, which the twin does not model)")


def test_on_a_gpu_study_the_tp_line_names_the_what_if_on_its_own_device():
    from optimizer.cli.plan import _tp_line
    from optimizer.record import of_study

    on_h100 = {of_study.DEVICE: "gpu", of_study.DEVICE_NAME: "NVIDIA H100 80GB HBM3"}
    assert _tp_line(on_h100, "gpu").startswith("TP: `plan --what-if h100 --tp 2,4` predicts tensor-parallel sizes on "
                                               "the study's own device, its step cost corrected by the study's runs")
    assert "--measured-on names it" in _tp_line({of_study.DEVICE: "gpu"}, "gpu")
    assert _tp_line({}, "cpu").startswith("TP: not predicted on CPU")
