"""workload/drift.py: a workload's shape, when two shapes are different traffic, and which file in a
watched path is the current trace. Traces go through the real reader and builder."""

import json
import math
import os
import random
from dataclasses import replace

import pytest

from optimizer.config.workload_spec import ArrivalSpec, TraceSpec
from optimizer.errors import ConfigError
from optimizer.workload.base import Request, Workload
from optimizer.workload.drift import (
    Shape,
    changes,
    current_source,
    fingerprint,
    shape_of,
)
from optimizer.workload.tokens import Vocabulary
from optimizer.workload.trace import trace_workload

NOW = 1_700_000_000.0


def workload(inputs, outputs, offsets=None, concurrency=None, after=None, warmup=()):
    offsets = offsets or [0.0] * len(inputs)
    after = after or [None] * len(inputs)
    reqs = tuple(Request(f"r{i}", tuple(range(3, 3 + n)), out, off, aft)
                 for i, (n, out, off, aft) in enumerate(zip(inputs, outputs, offsets, after)))
    warm = tuple(Request(f"w{i}", tuple(range(3, 3 + n)), 1, 0.0) for i, n in enumerate(warmup))
    return Workload("test", reqs, warm, concurrency)


def rows(seed, n, prompt_scale=1, time_scale=1.0):
    """Generic JSONL rows from one distribution: prompts 20-200, outputs 16-128, Poisson at 2 req/s."""
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        t += rng.expovariate(2.0)
        out.append({"timestamp": round(t * time_scale, 4), "input_tokens": rng.randint(20, 200) * prompt_scale,
                    "output_tokens": rng.randint(16, 128)})
    return out


def traced(tmp_path, name, trace_rows, arrival=None):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in trace_rows))
    spec = TraceSpec(path=str(path), **({"arrival": arrival} if arrival else {}))
    return trace_workload(spec, Vocabulary(32000))


def base_shape(**kw):
    return replace(Shape(240, 40.0, 180.0, 900.0, 32.0, 128.0, 512.0, 2.5), **kw)


def touch(path, age_s, text="{}\n"):
    path.write_text(text)
    os.utime(path, (NOW - age_s, NOW - age_s))
    return path


def test_shape_quantiles_and_rate_on_a_known_workload():
    w = workload(list(range(10, 101, 10)), [5] * 10, [i * 0.5 for i in range(10)], warmup=[5000, 6000])
    s = shape_of(w)
    assert s.requests == 10  # warm-up is not the traffic
    assert (s.input_p10, s.input_p50, s.input_p90) == pytest.approx((19.0, 55.0, 91.0))
    assert (s.output_p10, s.output_p50, s.output_p90) == (5.0, 5.0, 5.0)
    assert s.rate == pytest.approx(2.0)  # 9 gaps over 4.5 s


def test_agent_follow_ups_are_left_out_of_the_rate():
    w = workload([10] * 4, [5] * 4, [0.0, 1.0, 0.1, 2.0], after=[None, None, "r1", None])
    assert shape_of(w).rate == pytest.approx(1.0)  # roots at 0, 1, 2 s; the follow-up's 0.1 s is a delay
    only_one_root = workload([10] * 3, [5] * 3, [0.0, 0.1, 0.1], after=[None, "r0", "r1"])
    assert shape_of(only_one_root).rate is None
    assert shape_of(workload([10], [5])).rate is None


def test_closed_loop_has_no_rate(tmp_path):
    w = traced(tmp_path, "t.jsonl", rows(1, 20), ArrivalSpec(process="closed", concurrency=4))
    assert w.concurrency == 4 and shape_of(w).rate is None


def test_shape_of_a_real_trace(tmp_path):
    trace = [{"timestamp": 10.0 + i, "input_tokens": 100 + i, "output_tokens": 7} for i in range(11)]
    s = shape_of(traced(tmp_path, "t.jsonl", trace))
    assert s.requests == 11 and s.input_p50 == 105.0 and s.output_p90 == 7.0 and s.rate == pytest.approx(1.0)


def test_same_traffic_resampled_is_no_change(tmp_path):
    a = shape_of(traced(tmp_path, "a.jsonl", rows(1, 300)))
    b = shape_of(traced(tmp_path, "b.jsonl", rows(2, 500)))
    assert a.requests != b.requests
    assert changes(a, b) == [] and changes(b, a) == []


def test_prompts_four_times_longer_change_the_input_only(tmp_path):
    a = shape_of(traced(tmp_path, "a.jsonl", rows(1, 200)))
    b = shape_of(traced(tmp_path, "b.jsonl", rows(1, 200, prompt_scale=4)))
    got = changes(a, b)
    assert [c.split(" ")[:2] for c in got] == [["input", "p10"], ["input", "p50"], ["input", "p90"]]
    assert all(c.endswith("tokens (x4.00)") for c in got)


def test_rate_halved_is_a_change_naming_the_rate(tmp_path):
    a = shape_of(traced(tmp_path, "a.jsonl", rows(1, 200)))
    b = shape_of(traced(tmp_path, "b.jsonl", rows(1, 200, time_scale=2.0)))
    got = changes(a, b)
    assert len(got) == 1 and got[0].startswith("rate ") and got[0].endswith("req/s (x0.50)")
    assert changes(base_shape(rate=2.5), base_shape(rate=1.0)) == ["rate 2.50 -> 1.00 req/s (x0.40)"]


def test_open_and_closed_loop_switch_is_a_change():
    assert changes(base_shape(), base_shape(rate=None)) == ["arrival 2.50 req/s -> closed loop"]
    assert changes(base_shape(rate=None), base_shape()) == ["arrival closed loop -> 2.50 req/s"]
    assert changes(base_shape(rate=None), base_shape(rate=None)) == []


def test_threshold_boundary_is_not_a_change_just_above_is():
    assert changes(base_shape(input_p50=100.0), base_shape(input_p50=125.0)) == []
    assert changes(base_shape(input_p50=100.0), base_shape(input_p50=80.0)) == []  # symmetric: 100/80 = 1.25
    assert changes(base_shape(input_p50=100.0), base_shape(input_p50=125.1)) == ["input p50 100 -> 125 tokens (x1.25)"]
    assert changes(base_shape(input_p50=100.0), base_shape(input_p50=79.9)) != []
    assert changes(base_shape(rate=2.0), base_shape(rate=2.5)) == []
    assert changes(base_shape(rate=2.0), base_shape(rate=2.6)) != []
    assert changes(base_shape(input_p50=100.0), base_shape(input_p50=300.0), threshold=2.0) == []


def test_request_count_alone_is_no_change_and_zero_is_handled():
    assert changes(base_shape(), base_shape(requests=10_000)) == []
    assert changes(base_shape(output_p10=0.0), base_shape(output_p10=0.0)) == []
    assert changes(base_shape(output_p10=0.0), base_shape(output_p10=3.0)) == ["output p10 0 -> 3 tokens"]


def test_all_at_once_is_an_infinite_rate():
    s = shape_of(workload([10] * 4, [5] * 4))
    assert s.rate == math.inf and s.describe().endswith("all at once")
    assert changes(s, s) == [] and changes(base_shape(), replace(base_shape(), rate=math.inf)) != []


@pytest.mark.parametrize("shape", [base_shape(), base_shape(rate=None), base_shape(rate=math.inf)])
def test_to_dict_round_trips_through_strict_json(shape):
    text = json.dumps(shape.to_dict(), allow_nan=False)
    assert Shape.from_dict(json.loads(text)) == shape


def test_describe_is_one_line():
    assert base_shape().describe() == ("240 requests, input p50 180 (p10 40, p90 900) tokens, "
                                       "output p50 128, 2.50 req/s")
    assert base_shape(rate=None).describe().endswith("output p50 128, closed loop")


def test_current_source_of_a_file_is_that_file(tmp_path):
    f = touch(tmp_path / "t.jsonl", 0)
    assert current_source(f, now=NOW) == f and current_source(str(f)) == f


def test_current_source_of_a_directory_is_its_newest_settled_trace(tmp_path):
    touch(tmp_path / "a.jsonl", 100)
    touch(tmp_path / "b.csv", 50)
    touch(tmp_path / ".hidden.jsonl", 10)
    touch(tmp_path / "notes.txt", 5)
    (tmp_path / "d.jsonl").mkdir()
    touch(tmp_path / "c.json", 1)  # still being written at settle_s=2
    assert current_source(tmp_path, settle_s=2.0, now=NOW) == tmp_path / "b.csv"
    assert current_source(tmp_path, settle_s=0.5, now=NOW) == tmp_path / "c.json"


def test_current_source_breaks_mtime_ties_by_name(tmp_path):
    touch(tmp_path / "trace-001.jsonl", 10)
    touch(tmp_path / "trace-002.jsonl", 10)
    assert current_source(tmp_path, now=NOW) == tmp_path / "trace-002.jsonl"


def test_current_source_of_a_directory_without_traces_is_none(tmp_path):
    assert current_source(tmp_path, now=NOW) is None
    touch(tmp_path / ".partial.jsonl", 100)
    touch(tmp_path / "readme.md", 100)
    assert current_source(tmp_path, now=NOW) is None


def test_current_source_of_a_missing_path_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"watch .*nowhere: no such file or directory; give a trace file"):
        current_source(tmp_path / "nowhere")


def test_fingerprint_changes_when_the_file_is_rewritten_or_appended(tmp_path):
    f = touch(tmp_path / "t.jsonl", 100, '{"a": 1}\n')
    first = fingerprint(f)
    assert first == fingerprint(f) and first.startswith(str(f.resolve()) + ":9:")
    with f.open("a") as out:
        out.write('{"b": 2}\n')
    appended = fingerprint(f)
    assert appended != first
    touch(f, 50, '{"a": 1}\n')  # same size and content, written again
    assert fingerprint(f) not in (first, appended)


def _live(**kw) -> Shape:
    base = dict(requests=300, input_p10=100.0, input_p50=200.0, input_p90=400.0, output_p10=20.0,
                output_p50=60.0, output_p90=120.0, rate=2.0, burstiness=1.0, prefix_hit_rate=0.3, concurrency=6.0)
    return Shape(**{**base, **kw})


def test_live_traffic_drifts_on_prefix_hits_burstiness_and_concurrency():
    old = _live()
    assert changes(old, _live()) == []
    assert changes(old, _live(prefix_hit_rate=0.42)) == []  # 12 points: within half the threshold
    assert changes(old, _live(prefix_hit_rate=0.5)) == ["prefix-cache hit rate 30% -> 50%"]
    assert changes(old, _live(burstiness=3.9)) == []  # a noisy estimate: only 4x counts
    assert changes(old, _live(burstiness=0.2)) == ["burstiness 1.00 -> 0.20 (x0.20)"]
    assert changes(old, _live(concurrency=8.9)) == []  # within twice the threshold
    assert changes(old, _live(concurrency=9.5)) == ["in flight 6.0 -> 9.5 (x1.58)"]
    assert changes(_live(concurrency=0.2), _live(concurrency=3.9)) == []  # below 4: a few gauge reads' noise
    assert changes(old, _live(prefix_hit_rate=None, burstiness=None, concurrency=None)) == []  # unknown: not compared


def test_a_shape_stored_before_the_live_fields_existed_still_loads():
    d = _live().to_dict()
    for key in ("burstiness", "prefix_hit_rate", "concurrency"):
        d.pop(key)
    old = Shape.from_dict(d)
    assert old.burstiness is None and old.prefix_hit_rate is None and old.concurrency is None
    assert Shape.from_dict(_live().to_dict()) == _live()


def test_an_observed_window_s_shape_comes_from_its_histograms():
    from optimizer.traffic.histogram import Histogram
    from optimizer.traffic.window import Window
    from optimizer.workload.drift import shape_of_window

    bounds = (100.0, 200.0, 500.0, math.inf)
    w = Window({"kind": "vllm_metrics", "urls": []}, 0.0, 100.0, 200.0, Histogram(bounds, (0, 100, 200, 200), 4e4),
               Histogram(bounds, (200, 200, 200, 200), 1e4), prefix_queries=4e4, prefix_hits=1e4, sub_s=10.0,
               counts=(10.0,) * 20, concurrency=3.0)
    s = shape_of_window(w)
    # The quantiles are the fitted distribution's (traffic/lengths.py), the one the workload draws from.
    assert s.input_p50 == pytest.approx(200.0, abs=1) and 200 < s.input_p90 < 500 and 0 < s.output_p50 <= 100
    assert (s.requests, s.rate) == (200, 2.0)
    assert (s.prefix_hit_rate, s.burstiness, s.concurrency) == (0.25, 20.0, 3.0)
    few = shape_of_window(replace(w, counts=(20.0,) * 10))
    assert few.burstiness is None and w.burstiness == replace(w, counts=(20.0,) * 10).burstiness == 20.0


def test_a_workload_s_burstiness_is_its_gaps_gamma_shape():
    rng = random.Random(0)
    t, offs = 0.0, []
    for _ in range(3000):
        t += rng.gammavariate(0.25, 4.0)  # shape 0.25: bursty
        offs.append(t)
    s = shape_of(workload([10] * 3000, [10] * 3000, offs))
    assert s.burstiness == pytest.approx(0.25, rel=0.15)


def test_long_prompts_in_the_top_bucket_are_read_as_the_workload_draws_them_never_as_a_bucket_edge():
    """Prompts of ~3,400 tokens on a server whose top finite bucket is 2000: the drift line and the
    workload agree (within the workload's own p10-p90), and no quantile reads 2000."""
    from optimizer.traffic.histogram import Histogram
    from optimizer.traffic.lengths import draw_lengths
    from optimizer.traffic.window import Window
    from optimizer.workload.drift import shape_of_window

    bounds = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, math.inf)
    sent = [3200 + (i * 37) % 400 for i in range(60)]  # 3,200-3,599 tokens
    prompt = Histogram(bounds, tuple(0.0 if b < math.inf else 60.0 for b in bounds), float(sum(sent)))
    output = Histogram(bounds, tuple(0.0 if b < 100 else 60.0 for b in bounds), 60 * 80.0)
    w = Window({"kind": "vllm_metrics", "urls": []}, 0.0, 60.0, 60.0, prompt, output)
    s = shape_of_window(w)
    drawn = sorted(draw_lengths(prompt, 2000, random.Random(0)))
    low, high = drawn[len(drawn) // 10], drawn[9 * len(drawn) // 10]
    for q in (s.input_p10, s.input_p50, s.input_p90):
        assert q != 2000.0 and low - 1 <= q <= high + 1
    assert s.input_unplaced is None and "2000" not in s.describe()


def test_a_top_bucket_the_fit_cannot_place_is_said_to_be_at_least_its_edge():
    from optimizer.traffic.histogram import Histogram
    from optimizer.traffic.window import Window
    from optimizer.workload.drift import changes, shape_of_window

    bounds = (1000.0, 2000.0, math.inf)
    prompt = Histogram(bounds, (0.0, 0.0, 50.0), 50 * 9000.0)  # mean 9,000: beyond the bucket's reach
    output = Histogram(bounds, (50.0, 50.0, 50.0), 50 * 100.0)
    s = shape_of_window(Window({"kind": "vllm_metrics", "urls": []}, 0.0, 60.0, 50.0, prompt, output))
    assert s.input_unplaced == 2000.0 and s.input_p50 == 2000.0
    assert "input p50 >= 2000 (top bucket)" in s.describe()
    before = replace(s, input_p10=300.0, input_p50=300.0, input_p90=300.0, input_unplaced=None)
    assert "input p50 300 -> >= 2000 (top bucket) tokens" in changes(before, s)
